"""What methods exist and which settings each takes, without importing any of them (no torch): the CLI and
`RunConfig.validate` check names and `--method-option` values here in milliseconds; `evalsuite.methods.base.
get_method` imports a method's module only when it is built.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Callable

from evalsuite.errors import UserError


@dataclass(frozen=True)
class Option:
    """One `--method-option METHOD.KEY=VALUE` setting: its type, a check, and what it does."""

    kind: type  # int | float | str
    help: str
    check: Callable[[object], bool] = lambda value: True
    rule: str = ""  # what `check` requires, for the error message

    def parse(self, method: str, key: str, raw) -> object:
        try:
            value = self.kind(raw)
        except (TypeError, ValueError):
            raise UserError(f"--method-option {method}.{key}={raw}: not a valid {self.kind.__name__}") from None
        if not self.check(value):
            raise UserError(f"--method-option {method}.{key}={raw}: {self.rule}")
        return value


@dataclass(frozen=True)
class MethodSpec:
    name: str
    module: str  # evalsuite.methods.<module> defines `build(target, options) -> Method`
    summary: str
    needs_checkpoint: bool = False  # a learned method: loads a drafter (`--drafter`) or the shipped default
    options: dict[str, Option] = field(default_factory=dict)
    learns_across_turns: bool = False  # keeps what earlier replies taught it (across turns, in one process)
    repeatable: bool = True  # a turn decoded again does the same work (a learning method can forget the turn)
    not_in_vllm: str = ""  # why `--engine vllm` cannot run it ("" = vLLM runs it)

    @property
    def factory(self):
        """The method's `build(target, options)`; importing its module (and torch) only now."""
        return importlib.import_module(f"evalsuite.methods.{self.module}").build

    def parse_options(self, raw: dict) -> dict:
        """`--method-option` values for this method, converted and checked; an unknown key is a one-line error."""
        parsed = {}
        for key, value in raw.items():
            if key not in self.options:
                choices = ", ".join(sorted(self.options)) or "none"
                raise UserError(f"--method-option {self.name}.{key}: unknown setting{suggest(key, self.options)}; "
                                f"{self.name} takes: {choices}")
            parsed[key] = self.options[key].parse(self.name, key, value)
        return parsed


SEED = Option(int, "seed of a random-init drafter (--drafter METHOD=random)")


def _positive(value) -> bool:
    return value >= 1


METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in [
    MethodSpec("ar", "ar", "no drafting: the target decodes one token per forward (the speedup baseline)"),
    MethodSpec("ngram", "ngram", "prompt lookup: proposes the continuation of the latest earlier match of the last n "
               "tokens", options={
                   "max_ngram": Option(int, "longest n-gram looked up (3)", _positive, "must be >= 1"),
                   "min_ngram": Option(int, "shortest n-gram looked up (1)", _positive, "must be >= 1")}),
    MethodSpec("suffix", "suffix", "SuffixDecoding (arctic-inference): suffix trees over the context and over earlier "
               "replies", options={
                   "max_depth": Option(int, "tokens matched against the trees (64)", lambda v: v >= 2,
                                       "must be >= 2"),
                   "max_spec_factor": Option(float, "draft length per matched token (1.0)", lambda v: v >= 0,
                                             "must be >= 0"),
                   "max_spec_offset": Option(float, "draft length offset (0)"),
                   "min_token_prob": Option(float, "smallest estimated probability followed (0.1)",
                                            lambda v: 0 <= v <= 1, "must be in [0, 1]"),
                   "max_cached_requests": Option(int, "replies kept in the global tree (-1 = all)",
                                                 lambda v: v != 0, "0 would switch the global tree off; use -1 "
                                                 "for no limit")},
               learns_across_turns=True),  # and forgets a repeated turn's reply (rewind_turn)
    MethodSpec("dlite", "dlite", "DLite: history-free block drafter (last token's multi-layer features, RNN head, no "
               "KV cache)", True, {"anchor_group_size": Option(int, "random init: anchors per group G (1)", _positive,
                                                                "must be >= 1"), "seed": SEED},
               not_in_vllm="vLLM has no DLite drafter"),
    MethodSpec("eagle3", "eagle3", "EAGLE-3: one draft layer over fused target features, draft KV cache, chain "
               "drafting", True, {
                   "format": Option(str, "random init: deepspec | specforge layout", lambda v: v in
                                    ("deepspec", "specforge"), "choose deepspec or specforge"),
                   "draft_vocab_size": Option(int, "random init: reduced draft vocabulary size", _positive,
                                              "must be >= 1"),
                   "seed": SEED}),
    MethodSpec("dflash", "dflash", "DFlash: parallel block drafter over a draft KV cache (z-lab b16 or DeepSpec "
               "block7 layout)", True, {"layout": Option(str, "random init: zlab | block7", lambda v: v in
                                                         ("zlab", "block7"), "choose zlab or block7"),
                                        "seed": SEED},
               not_in_vllm="vLLM's dflash loads DFlashQwen3/Laguna drafters for Qwen3-family targets only, not our "
                           "DFlashDraftModel checkpoint for a Llama target"),
    MethodSpec("dspark", "dspark", "DSpark (DeepSpec): DFlash backbone, every slot predicts, Markov head, confidence "
               "head", True, {"confidence_threshold": Option(float, "truncate the block at the first slot whose "
                                                              "confidence is below it (0 = off)",
                                                              lambda v: 0 <= v <= 1, "must be in [0, 1]"),
                              "seed": SEED},
               not_in_vllm="vLLM's dspark is DeepSeek-V4 only and its sparse attention does not run on CPU"),
]}


def method_spec(name: str) -> MethodSpec:
    if name not in METHODS:
        raise UserError(f"unknown method '{name}'{suggest(name, METHODS)}; choose from: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def suggest(name: str, choices) -> str:
    """' (did you mean X?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
