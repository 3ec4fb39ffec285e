"""The engine protocol: what the runner asks of whatever decodes a turn.

An engine starts the methods of a run on a target, decodes one turn of one method from a context (the target
prefill timed apart), and describes itself for run.json. The runner owns everything else (data, replay, records,
pairing, the store), so every engine writes the same records. Two implementations: `hf.HfEngine` (ours: the
gpt-fast-plain loop of `loop.py`, per-step times and draft memory, every method) and `vllm.VllmEngine` (vLLM's
speculative decoding in its own venv; per-request acceptance, no per-step times).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

from evalsuite.store.records import TurnResult
from evalsuite.target.chat import ChatTokenizer


class Engine(ABC):
    name: str  # the `engine` column of every record
    chat: ChatTokenizer  # the target's tokenizer, template and window: what the runner renders contexts with
    device_label: str = "cpu"  # the `worker_device` of every record unless a scale-out worker names its own

    @abstractmethod
    def start(self, methods: list[str], threads: int | None = None, weight_layout: str | None = None,
              attention_lanes: int | None = None) -> None:
        """Load the target's tokenizer (`self.chat`), the target and every method (`ar` first), with `threads`
        intra-op threads on CPU and `weight_layout` instead of the config's (a resumed run keeps the one its first
        part resolved, and `attention_lanes` the CPU attention's lane form it was timed with); one-line errors."""

    def warm_up(self, ids: list[int]) -> dict[str, float]:
        """Untimed first calls on a short context, so that no recorded turn pays them; returns each method's
        seconds per token in them where measured (the plan's estimate)."""
        return {}

    def tune_threads(self, candidates: list[int]) -> dict | None:
        """`--threads auto`: time the target at each candidate intra-op thread count, keep the fastest, and return
        what was measured ({"candidates": {threads: {...ms}}, "chosen": threads, "rule": ...}); None when the
        engine has nothing to choose (a GPU, another process's engine)."""
        return None

    def begin_trajectory(self) -> None:
        """A new trajectory starts: forget the previous one's cached context."""

    @abstractmethod
    def decode(self, method: str, ids: list[int], seed: int,
               on_step: Callable[[int], None] | None = None) -> TurnResult:
        """Decode one turn of `method` from the context `ids`; `seed` fixes its sampling (unused at T=0);
        `on_step(tokens)` reports progress (outside the timed intervals)."""

    @abstractmethod
    def describe(self) -> dict:
        """What run.json records about the target, its tokenizer, the methods and the device."""

    def close(self) -> None:
        """Release what `start` acquired (processes, temporary files)."""
