"""Our engine: the target in PyTorch through its Hugging Face code, every method, per-step times and draft memory.

One target KV cache serves every method of a trajectory (`PrefixCache`): before a turn it is cropped to the
longest common prefix with the new context and only the rest is prefilled, so methods that see the same context
share one prefill and a growing agent context is prefilled incrementally. Each decode runs the loop of `loop.py`
`--repeats` times from the same seed and keeps the median repeat.
"""

from __future__ import annotations

import socket
import statistics
from dataclasses import dataclass, field

import torch

from evalsuite import contention
from evalsuite.catalog import EngineSpec
from evalsuite.config import RunConfig
from evalsuite.engines.base import Engine
from evalsuite.engines.loop import decode_turn
from evalsuite.errors import UserError
from evalsuite.methods.base import Method, Sampling, build_method, common_prefix_len
from evalsuite.store.records import TurnResult
from evalsuite.target import cpu_kernels
from evalsuite.target.model import TargetModel, cached_weights_hash
from evalsuite.target.remembered import cpu_model, remembered_choice
from evalsuite.timing import DeviceClock


SPEC = EngineSpec("hf", "ours: the target in PyTorch, every method, per-step times and draft memory",
                  cpu_dtypes=("float32",))


@dataclass
class PrefixCache:
    """The target KV cache plus the token ids it holds and their features for the methods' layers."""

    target: TargetModel
    layer_ids: tuple[int, ...]
    cache: object = None
    ids: list[int] = field(default_factory=list)
    features: torch.Tensor | None = None  # [n, len(layer_ids), H]
    last_logits: torch.Tensor | None = None  # logits at the last cached position

    def __post_init__(self):
        self.cache = self.target.new_cache()

    def prefill(self, ids: list[int]) -> int:
        """Bring the cache to exactly `ids`; returns how many tokens were run through the target."""
        common = common_prefix_len(torch.tensor(self.ids, dtype=torch.long), torch.tensor(ids, dtype=torch.long))
        if common == len(ids) and common == len(self.ids) and self.last_logits is not None:
            return 0
        common = min(common, len(ids) - 1)  # the last token always runs, to produce fresh logits
        self.cache.crop_to(common)
        self.ids = self.ids[:common]
        if self.features is not None:
            self.features = self.features[:common]
        fresh = torch.tensor(ids[common:], dtype=torch.long, device=self.target.device)
        out = self.target.forward(fresh, self.cache, self.layer_ids, last_only=True)
        self.ids = list(ids)
        self.last_logits = out.logits
        if out.hidden is not None:
            self.features = out.hidden if self.features is None else torch.cat([self.features, out.hidden])
        return fresh.numel()

    def rewind(self) -> None:
        """Drop whatever a decode appended beyond the cached context."""
        self.cache.crop_to(len(self.ids))

    def features_for(self, layers: tuple[int, ...]) -> torch.Tensor | None:
        if not layers or self.features is None:
            return None
        index = [self.layer_ids.index(j) for j in layers]
        return self.features[:, index]


class HfEngine(Engine):
    name = "hf"

    def __init__(self, config: RunConfig):
        self.config = config
        self.sampling = Sampling(config.temperature, config.top_p, config.top_k)
        self.target: TargetModel | None = None
        self.methods: dict[str, Method] = {}
        self.prefix: PrefixCache | None = None

    def start(self, methods: list[str], threads: int | None = None, weight_layout: str | None = None,
              attention_lanes: int | None = None) -> None:
        cfg = self.config
        if threads is not None:
            torch.set_num_threads(threads)
        self.target = TargetModel.load(cfg.target, cfg.device, cfg.dtype, weight_layout or cfg.weight_layout,
                                       cfg.kv_cache, cfg.compile, cfg.cuda_graphs, cfg.captured_attention)
        # untimed: verify blocks of up to k+1 rows
        self.packed_blocks = self.target.prepare_blocks(cfg.k + 1, attention_lanes)
        self.chat = self.target.chat
        # the records' `worker_device`: on a CPU with its model, so turns timed on different machines stay apart
        self.device_label = f"cpu ({cpu_model()})" if self.target.device.type == "cpu" else str(self.target.device)
        self.clock = DeviceClock(self.target.device)
        for name in methods:
            options = dict(cfg.method_options.get(name, {}))
            if name in cfg.drafters:
                options["drafter"] = cfg.drafters[name]
            method = build_method(name, self.target, options)
            self.target.check_layer_ids(method.feature_layers, f"method {name}")
            self.methods[name] = method
        self.layer_union = tuple(sorted({j for m in self.methods.values() for j in m.feature_layers}))
        self.target.prepare_layers({m.feature_layers for m in self.methods.values()})  # untimed: CUDA graphs

    def tune_threads(self, candidates: list[int]) -> dict | None:
        """Time a one-token decode and a (k+1)-token verify after 512 cached tokens at each thread count (median
        of 5, after a warm-up) and keep the count with the lowest decode + verify; on a CPU only.

        The choice is remembered under evalsuite's cache dir, keyed by the host, the CPU, torch, the target's
        weights and layout (with the build of evalsuite's kernels on fused+panel), k and the candidate counts: a
        later run of the same set-up reuses it (its record says so, with the original measurement), so two runs of
        one machine are timed with the same count and can be merged. Delete `<cache>/threads-choice/` to measure again."""
        if self.target.device.type != "cpu" or len(candidates) < 2:
            return None
        key = {"host": socket.gethostname(), "cpu": cpu_model(), "torch": torch.__version__,
               "target_sha256": cached_weights_hash(self.target.model_dir), "dtype": str(self.target.dtype),
               "weight_layout": self.target.weight_layout, "k": self.config.k, "candidates": list(candidates),
               "kernels": cpu_kernels.build_tag() if "panel" in self.target.weight_layout else None}
        choice = remembered_choice("threads-choice", key, lambda: self._measure_threads(candidates),
                                   lambda saved: saved["chosen"] in candidates)
        torch.set_num_threads(choice["chosen"])
        return choice

    def _measure_threads(self, candidates: list[int]) -> dict:
        generator = torch.Generator().manual_seed(0)
        vocab = self.target.vocab_size
        context = torch.randint(4, vocab, (512,), generator=generator)
        blocks = [torch.randint(4, vocab, (n,), generator=generator) for n in (1, self.config.k + 1)]
        cache = self.target.new_cache()
        cache.reserve(512 + self.config.k + 1)
        self.target.forward(context, cache, last_only=True)
        measured = {}
        with self.target.eager():  # --compile: its graphs are built after the choice, at the chosen count
            for threads in candidates:
                torch.set_num_threads(threads)
                times = []
                for repeat in range(6):
                    row = []
                    for block in blocks:
                        start = self.clock.mark()
                        self.target.forward(block, cache)
                        row.append(self.clock.seconds(start, self.clock.mark()))
                        cache.crop_to(512)
                    if repeat:  # the first is the warm-up
                        times.append(row)
                measured[threads] = {"decode_ms": round(1e3 * statistics.median(t[0] for t in times), 3),
                                     f"verify{self.config.k + 1}_ms":
                                         round(1e3 * statistics.median(t[1] for t in times), 3)}
        chosen = min(candidates, key=lambda t: sum(measured[t].values()))
        torch.set_num_threads(chosen)
        rule = f"lowest decode + verify-{self.config.k + 1} time after 512 cached tokens (median of 5)"
        if self.target.compile:
            rule += ("; measured on the eager forward, since --compile's kernels keep the thread count they are "
                     "built with (built afterwards, at the chosen count)")
        return {"candidates": {str(t): v for t, v in measured.items()}, "chosen": chosen, "rule": rule}

    def begin_trajectory(self) -> None:
        self.prefix = PrefixCache(self.target, self.layer_union)

    def warm_up(self, ids: list[int]) -> dict[str, float]:
        """One short decode per method (twice: the second is timed for the plan), then a target forward of every
        verify block size the run can use (1 … k+1) for each set of feature layers read."""
        per_token = {}
        for name, method in self.methods.items():
            prefix = PrefixCache(self.target, method.feature_layers)
            prefix.prefill(ids)
            for _ in range(2):
                result = self._loop(method, prefix, ids, 16, torch.Generator().manual_seed(0))
                prefix.rewind()
            per_token[name] = result.decode_s / max(len(result.output_ids), 1)
            method.reset()  # the warm-up reply is not part of the run
        for layers in sorted({m.feature_layers for m in self.methods.values()}):
            prefix = PrefixCache(self.target, layers)
            prefix.prefill(ids)
            for size in range(1, self.config.k + 2):
                block = torch.tensor(ids[:size] + ids[:1] * max(size - len(ids), 0), dtype=torch.long,
                                     device=self.target.device)
                self.target.forward(block, prefix.cache, layers)
                prefix.rewind()
        return per_token

    def decode(self, method: str, ids: list[int], seed: int, on_step=None) -> TurnResult:
        """Prefill (timed apart), then the decode loop --repeats times from the same seed; the median repeat."""
        if self.prefix is None:
            self.begin_trajectory()
        start = self.clock.mark()
        prefill_tokens = self.prefix.prefill(ids)
        prefill_s = self.clock.seconds(start, self.clock.mark())
        results = []
        for repeat in range(self.config.repeats):
            if repeat:
                self.methods[method].rewind_turn()  # a method that learns from its replies forgets this one
            results.append(self._loop(self.methods[method], self.prefix, ids, self.config.max_new_tokens,
                                      torch.Generator().manual_seed(seed), on_step))
            self.prefix.rewind()
        result = median_repeat(results, f"method {method}")
        result.prefill_tokens, result.prefill_s = prefill_tokens, prefill_s
        return result

    def _loop(self, method: Method, prefix: PrefixCache, ids: list[int], max_new_tokens: int,
              generator: torch.Generator, on_step=None) -> TurnResult:
        context = torch.tensor(ids, dtype=torch.long, device=self.target.device)
        return decode_turn(self.target, method, prefix.cache, context, prefix.features_for(method.feature_layers),
                           prefix.last_logits, self.config.k, self.sampling, max_new_tokens, generator, self.clock,
                           on_step)

    def describe(self) -> dict:
        target = self.target
        methods = {name: m.describe() for name, m in self.methods.items()}
        return {
            "dtype": str(target.dtype).removeprefix("torch."),
            "weight_layout": target.weight_layout,
            "weight_layout_choice": target.products_choice,  # --weight-layout auto: the kernels measured, and why
            "attention_lanes_choice": target.attention_lanes_choice,  # the CPU attention's lane form, and why
            "packed_block_rows": target.fused.block_rows if target.fused is not None else 0,
            "cuda_graphs": target.cuda_graphs,  # resolved: on | off
            "captured_attention": target.captured_attention,  # resolved; None without CUDA graphs
            "captured": target.captured.describe() if target.captured is not None else None,
            "target_name": target.name,
            "target_path": target.model_dir,
            "target_sha256": cached_weights_hash(target.model_dir),
            "target_max_context": target.max_context,
            **self.chat.hashes(),
            "drafters": methods,
            "drafter_sha256": {n: d.get("checkpoint_sha256") for n, d in methods.items()},
            "draft_products": {n: d.get("draft_products") for n, d in methods.items()},  # build_method
            "threads": torch.get_num_threads(),
            "device_facts": device_facts(target.device),
            "device_processes": contention.cuda_processes() if target.device.type == "cuda" else [],
        }


def device_facts(device: torch.device) -> dict:
    """The device's name and CUDA version, for run.json."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu: {cpu_model()}, {torch.get_num_threads()} threads"
    return {"device_name": name, "cuda": torch.version.cuda}


def median_repeat(results: list[TurnResult], what: str) -> TurnResult:
    """The repeat whose decode loop took the median time (the lower middle one for an even count), with its steps.

    The method's start-of-turn work is taken from the first repeat: later repeats find a prefix-reusing method's
    cache already holding the context, so only the first pays what a real turn pays. Every repeat must have done
    the same work (same output, same drafts accepted); anything else is an error, not a silently mixed record.
    """
    first = results[0]
    work = [(s.num_drafted, s.num_accepted) for s in first.steps]
    for other in results[1:]:
        if other.output_ids != first.output_ids or [(s.num_drafted, s.num_accepted) for s in other.steps] != work:
            raise UserError(f"--repeats {len(results)}: {what}: a repeat decoded differently from the first "
                            "(nondeterministic kernels, or a method that learns from its own replies); "
                            "use --repeats 1")
    # every repeat's decode time on the same footing (the first repeat's start-of-turn work), kept for the noise
    repeats = [r.decode_s - r.draft_prefill_s + first.draft_prefill_s for r in results]
    loop = sorted(results, key=lambda r: r.decode_s - r.draft_prefill_s)[(len(results) - 1) // 2]
    loop.decode_s = loop.decode_s - loop.draft_prefill_s + first.draft_prefill_s
    loop.draft_prefill_s = first.draft_prefill_s
    loop.repeat_decode_s = repeats if len(results) > 1 else []
    return loop


def build(config: RunConfig, run_dir) -> HfEngine:
    return HfEngine(config)
