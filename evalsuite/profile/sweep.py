"""The timed sweep of `evalsuite profile`: cost surfaces with random weights — what a forward and a draft step cost
at each batch, context and block, on this device, for a target shape (`evalsuite.profile.shapes`), without its
weights.

A speedup is τ times a cost ratio. τ needs the real weights; the cost ratio does not: it depends on shapes,
batch, context and the device. So the target is built from a shape (a named one, a config.json, or the config of
a model directory) with random weights at the requested dtype, and each method's drafter is built for that shape
(random init, or a checkpoint when one is named: the weights do not change the cost, the architecture does).

Measured, with warm-up and repeats (median; on the harness's one clock, `evalsuite.timing`: CUDA events on a GPU,
`perf_counter` on a CPU, each call started on an idle device):
- the target at every (batch, context, block): `ms` of one forward of `block` new tokens in each of `batch` rows
  after `context` cached tokens (block 1 is the one-token decode, blocks 2 … k+1 are verify forwards). The cache
  is the engine's own (`evalsuite.target.kv_cache`, the weight layout the engine would use), filled with random K/V
  instead of a prefill (`KVCache.fill_synthetic`): attention costs the same whatever the values. Blocks are
  measured in turn, round after round, so machine noise hits them alike;
- each method at every (batch, context): `draft_ms` of one step = propose k + commit one token, and its draft
  state in bytes. At batch 1 it is the method itself, exactly as the engine calls it, after `start_turn` over a
  real-text context with random target features. At batch B > 1 it is `evalsuite.profile.batched`: the learned
  methods' own modules over a batch axis (true batched drafting), the model-free ones B sequential copies;
  the `batching` column says which;
- the target's KV bytes per token, its weight bytes, and the peak device memory of every point (CUDA).

Before every point its memory is estimated (`evalsuite.profile.memory`: weights stay resident; KV with the cache's
chunk rounding, activations, logits, a worst-case attention transient, the drafter's state from a calibration at
small contexts); a point over the budget is skipped and recorded (`fits` false, with the estimate), as is one that runs
out of memory anyway. Outputs: `target_cost.parquet`, `draft_cost.parquet`, `run.json`.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from evalsuite.catalog import WINDOW_KEY, method_spec
from evalsuite.config import environment, portable_paths
from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError
from evalsuite.methods.base import Method, Sampling, build_method
from evalsuite.profile.batched import ROOM, batched_drafter, batching_of
from evalsuite.profile.memory import (Budget, decoder_config, device_memory, draft_point_bytes, feature_rows, is_oom,
                                      kv_bytes_per_token, module_bytes, packed_bytes, parse_bytes, peak_bytes,
                                      peak_reset, release, single_stream_bytes, target_point_bytes)
from evalsuite.profile.shapes import build_target, real_text_ids
from evalsuite.target import embedded
from evalsuite.target.model import TargetModel
from evalsuite.timing import DeviceClock, wall

TARGET_COLUMNS = ["device", "target", "dtype", "batch", "context", "block", "ms"]
DRAFT_COLUMNS = ["device", "target", "method", "batch", "context", "k", "draft_ms", "state_bytes"]
EXTRA_TARGET = ["fits", "est_bytes", "peak_bytes", "note"]
EXTRA_DRAFT = ["dtype", "drafted", "batching", "fits", "est_bytes", "peak_bytes", "note"]


@dataclass
class ProfileSpec:
    batches: list[int]
    contexts: list[int]
    k: int = 7
    warmup: int = 2
    repeats: int = 5
    blocks: list[int] | None = None  # default 1 … k+1
    time_limit_s: float | None = None  # no new point starts after this many seconds (recorded as skipped)

    def block_sizes(self) -> list[int]:
        return sorted(set(self.blocks or range(1, self.k + 2)))


@dataclass
class Skip:
    what: str  # "target" | method name
    batch: int
    context: int
    block: int | None
    est_bytes: int
    budget_bytes: int
    reason: str


@dataclass
class Profile:
    target_rows: list[dict] = field(default_factory=list)
    draft_rows: list[dict] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    facts: dict = field(default_factory=dict)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


@dataclass
class Drafter:
    label: str
    name: str
    options: dict
    method: Method
    calibration: dict = field(default_factory=dict)  # state bytes per token and fixed, per stream

    def build_copy(self, target: TargetModel) -> Method:
        return build_method(self.name, target, self.options)


class Sweep:
    """The measurements, context by context (smallest first): the target at every batch and block, then every
    drafter at every batch. What does not fit in the budget, or would start after the time limit, is recorded as
    skipped with its reason."""

    def __init__(self, target: TargetModel, drafters: list[Drafter], spec: ProfileSpec, budget: Budget,
                 label: dict, profile: Profile, log: Callable[[str], None] = print):
        self.target, self.drafters, self.spec, self.budget = target, drafters, spec, budget
        self.label, self.profile, self.log = label, profile, log
        self.clock = DeviceClock(target.device)
        self.started = wall()
        self.text = None
        if drafters:
            top = max(spec.contexts) + ROOM + spec.k + 2
            self.top = top
            self.text = torch.tensor(real_text_ids(target, top + STREAM_OFFSET * max(spec.batches)),
                                     device=target.device)
            for drafter in drafters:
                drafter.calibration = single_stream_bytes(target, drafter.method, self.text, (64, 192))

    def out_of_time(self) -> bool:
        limit = self.spec.time_limit_s
        return limit is not None and wall() - self.started > limit

    # -- the target --
    def measure_target(self, context: int) -> None:
        """One row per (batch, block) at `context`: ms of a forward of `block` tokens in `batch` rows."""
        target, spec, profile = self.target, self.spec, self.profile
        blocks = spec.block_sizes()
        too_big = False
        for batch in sorted(spec.batches):
            need = target_point_bytes(target.config, target.dtype, batch, context, max(blocks))
            allowed = self.budget.available()
            reason = None
            if too_big or need > allowed:
                too_big = True  # every larger batch at this context needs more
                reason = f"estimated {need / 2**30:.2f} GiB > budget {allowed / 2**30:.2f} GiB"
            elif self.out_of_time():
                reason = f"time limit of {spec.time_limit_s:.0f} s reached"
            else:
                try:
                    times = self._time_target(batch, context, blocks)
                except (RuntimeError, MemoryError) as err:
                    if not is_oom(err):
                        raise
                    release(target.device)
                    too_big = True
                    reason = f"out of memory despite the estimate of {need / 2**30:.2f} GiB"
            for block in blocks:
                row = {**self.label, "batch": batch, "context": context, "block": block, "est_bytes": need}
                if reason:
                    profile.target_rows.append({**row, "ms": float("nan"), "fits": False, "peak_bytes": float("nan"),
                                                "note": reason})
                else:
                    profile.target_rows.append({**row, "ms": _median(times[block]), "fits": True,
                                                "peak_bytes": times["peak"], "note": ""})
            if reason:
                profile.skipped.append(Skip("target", batch, context, None, need, allowed, reason))
                self.log(f"  target batch {batch:>3} ctx {context:>7}: skipped ({reason})")
            else:
                line = "  ".join(f"{b}:{_median(times[b]):.2f}" for b in blocks)
                self.log(f"  target batch {batch:>3} ctx {context:>7}: ms per block {line}")

    def _time_target(self, batch: int, context: int, blocks: list[int]) -> dict:
        target, device = self.target, self.target.device
        release(device)
        peak_reset(device)
        cache = target.new_cache(captured=False)
        try:
            cache.fill_synthetic(target.config, batch, context, target.dtype, device, room=max(blocks))
            ids = torch.randint(4, min(target.vocab_size, 260), (batch, max(blocks)), device=device)
            times: dict = {b: [] for b in blocks}
            for round_ in range(self.spec.warmup + self.spec.repeats):  # blocks in turn, round after round
                for block in blocks:
                    seconds, _ = self.clock.time(lambda: target.forward_batch(ids[:, :block], cache))
                    cache.crop_to(context)
                    if round_ >= self.spec.warmup:
                        times[block].append(1e3 * seconds)
            times["peak"] = peak_bytes(device)
            return times
        finally:
            cache = None  # the K/V buffers go before the next point is allocated
            release(device)

    # -- the drafters --
    def measure_drafters(self, context: int) -> None:
        """One row per (method, batch) at `context`: draft ms of one step (propose k + commit one token), state."""
        if not self.drafters:
            return
        for batch in sorted(self.spec.batches):
            # stream i reads the text from offset STREAM_OFFSET·i, so the model-free drafters see different contexts
            ids = torch.stack([self.text[STREAM_OFFSET * i: STREAM_OFFSET * i + self.top] for i in range(batch)])
            groups, skipped = self._fitting_groups(batch, context)
            for drafter, need, allowed, reason in skipped:
                self._skip_drafter(drafter, batch, context, need, allowed, reason)
            for group in groups:
                if self.out_of_time():
                    for drafter, need in group:
                        self._skip_drafter(drafter, batch, context, need, 0,
                                           f"time limit of {self.spec.time_limit_s:.0f} s reached")
                    continue
                self._time_group(group, ids, batch, context)

    def _skip_drafter(self, drafter: Drafter, batch: int, context: int, need: int, allowed: int, reason: str):
        self.profile.skipped.append(Skip(drafter.name, batch, context, None, need, allowed, reason))
        self.profile.draft_rows.append({**self.label, "method": drafter.label, "batch": batch, "context": context,
                                        "k": self.spec.k, "draft_ms": float("nan"), "state_bytes": float("nan"),
                                        "drafted": float("nan"), "batching": _batching(drafter, batch),
                                        "fits": False, "est_bytes": need, "peak_bytes": float("nan"),
                                        "note": reason})
        self.log(f"  {drafter.label:<10} batch {batch:>3} ctx {context:>7}: skipped ({reason})")

    def _fitting_groups(self, batch: int, context: int):
        """Drafters that fit together (timed round-robin, step by step), in order; those that fit alone form their
        own group; those that do not fit at all are skipped."""
        groups, skipped, current, used = [], [], [], 0
        allowed = self.budget.available()
        for drafter in self.drafters:
            need = draft_point_bytes(self.target, drafter.method, drafter.calibration, batch, context,
                                     self.spec.k)
            if need > allowed:
                skipped.append((drafter, need, allowed, f"estimated {need / 2**30:.2f} GiB > budget "
                                                        f"{allowed / 2**30:.2f} GiB"))
                continue
            if used + need > allowed and current:
                groups.append(current)
                current, used = [], 0
            current.append((drafter, need))
            used += need
        if current:
            groups.append(current)
        return groups, skipped

    def _time_group(self, group, ids, batch, context) -> None:
        target, spec = self.target, self.spec
        device = target.device
        release(device)
        peak_reset(device)
        runners, failed = {}, {}
        for drafter, need in group:
            try:
                if batch == 1:
                    runners[drafter.label] = _Single(target, drafter, ids, context)
                else:
                    runner = batched_drafter(drafter.method, batch, lambda d=drafter: d.build_copy(target))
                    runner.fill(ids, context)
                    runners[drafter.label] = runner
            except (RuntimeError, MemoryError) as err:
                if not is_oom(err):
                    raise
                runners.pop(drafter.label, None)
                release(device)
                failed[drafter.label] = f"out of memory despite the estimate of {need / 2**30:.2f} GiB"
        times = {name: [] for name in runners}
        drafted = {}
        with torch.inference_mode():
            for round_ in range(spec.warmup + spec.repeats):  # methods in turn, step by step
                for name, runner in runners.items():
                    seconds, count = self.clock.time(lambda: runner.step(spec.k))
                    drafted[name] = int(count)
                    if round_ >= spec.warmup:
                        times[name].append(1e3 * seconds)
        peak = peak_bytes(device)
        for drafter, need in group:
            if drafter.label in failed:
                self._skip_drafter(drafter, batch, context, need, 0, failed[drafter.label])
                continue
            runner = runners[drafter.label]
            ms = _median(times[drafter.label])
            state = int(runner.state_bytes())
            self.profile.draft_rows.append({**self.label, "method": drafter.label, "batch": batch,
                                            "context": context, "k": spec.k, "draft_ms": ms, "state_bytes": state,
                                            "drafted": drafted[drafter.label],
                                            "batching": _batching(drafter, batch), "fits": True, "est_bytes": need,
                                            "peak_bytes": peak, "note": ""})
            self.log(f"  {drafter.label:<10} batch {batch:>3} ctx {context:>7}: draft {ms:8.2f} ms  state "
                     f"{state / 2**20:9.2f} MiB  ({_batching(drafter, batch)})")
        runners.clear()
        release(device)


STREAM_OFFSET = 97  # tokens between the starts of two streams' text


def build_drafters(target: TargetModel, methods: list[str], drafters: dict[str, str],
                   method_options: dict[str, dict] | None = None) -> list[Drafter]:
    """The methods to profile (not `ar`, which drafts nothing). Learned methods: the checkpoint named for them,
    else the shipped default when the target is the default one (as `evalsuite run` would load), else an
    untrained drafter of the default size for this shape (`random`)."""
    built = []
    for spec_text in methods:
        name = method_spec(spec_text).method
        if name == BASELINE:
            continue
        spec, options = method_spec(name), profile_options(spec_text, method_options)
        if spec.needs_checkpoint:
            source = drafters.get(name)
            if source is None:
                # an embedded target's own shipped drafters (their architecture is what costs), else random init
                source = None if embedded.by_name(target.name) is not None else "random"
            if source is not None:
                options["drafter"] = source
        built.append(Drafter(spec_text, name, options, build_method(name, target, options)))
    return built


def profile_options(label: str, method_options: dict[str, dict] | None) -> dict:
    """A profiled method's settings: those of its label (`eagle3:format=specforge`, evalsuite.catalog) and its
    base's --method-option. A draft window is refused: the batched drafters and the state model (bytes per
    token) measure the whole-context cache."""
    spec = method_spec(label)
    raw = {k: v for k, v in (method_options or {}).get(spec.method, {}).items() if k not in spec.presets}
    options = spec.parse_options(raw)
    if WINDOW_KEY in options:
        raise UserError(f"profile --method {label}: a draft window is not profiled (the batched drafters and the "
                        "per-token state model assume the whole-context cache); profile without window")
    return options


def _batching(drafter: Drafter, batch: int) -> str:
    return "method" if batch == 1 else batching_of(drafter.method)


class _Single:
    """Batch 1: the method itself, as the engine calls it."""

    def __init__(self, target: TargetModel, drafter: Drafter, ids: torch.Tensor, context: int):
        self.target, self.method = target, drafter.method
        self.ids = ids[0]
        self.anchor = context
        self.method.reset()
        self.method.start_turn(self.ids[: context + 1], feature_rows(target, self.method, context))
        self.bonus_features = feature_rows(target, self.method, 1)

    def step(self, k: int) -> int:
        proposal = self.method.propose(k, Sampling(), None)
        self.anchor += 1
        self.method.commit(self.ids[self.anchor: self.anchor + 1], self.bonus_features)
        return int(proposal.tokens.numel())

    def state_bytes(self) -> int:
        return self.method.state_bytes().total


def parse_sizes(text: str, what: str) -> list[int]:
    """'1,2,4' or '1k,4k,128k' or a log-spaced range '1k..128k' (powers of two) → sorted ints."""
    def one(token: str) -> int:
        token = token.strip().lower()
        scale = 1024 if token.endswith("k") else 1
        try:
            value = int(float(token.rstrip("k")) * scale)
        except ValueError:
            raise UserError(f"--{what} {text}: '{token}' is not a size (write e.g. 512,1k,4k or 1k..128k)") from None
        if value < 1:
            raise UserError(f"--{what} {text}: sizes must be >= 1")
        return value

    values: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        if ".." in part:
            low, high = (one(x) for x in part.split("..", 1))
            value = low
            while value <= high:
                values.add(value)
                value *= 2
        else:
            values.add(one(part))
    if not values:
        raise UserError(f"--{what}: give at least one size")
    return sorted(values)


def run_profile(out: Path, target: str | None = None, target_shape: str | None = None,
                methods: list[str] | None = None, drafters: dict[str, str] | None = None,
                method_options: dict[str, dict] | None = None, batches: list[int] = (1,),
                contexts: list[int] = (1024,), k: int = 7, device: str = "cpu", dtype: str | None = None,
                weight_layout: str = "auto", warmup: int = 2, repeats: int = 5, memory_budget: str | None = None,
                threads: int | None = None, time_limit_s: float | None = None,
                log: Callable[[str], None] = print) -> Profile:
    """Measure and write `target_cost.parquet`, `draft_cost.parquet` and `run.json` under `out`."""
    if k < 1:
        raise UserError(f"--k {k}: must be >= 1")
    if warmup < 0 or repeats < 1:
        raise UserError("--warmup must be >= 0 and --repeats >= 1")
    for spec_text in methods or []:  # names and settings first: a typo costs milliseconds, not a model build
        profile_options(spec_text, method_options)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a directory")
    if threads:
        torch.set_num_threads(threads)
    from evalsuite import contention

    load = contention.snapshot()
    model = build_target(target, target_shape, device, dtype, weight_layout)
    model.prepare_blocks(k + 1)  # as the engine does: verify blocks of up to k+1 tokens ready before timing
    spec = ProfileSpec(list(batches), list(contexts), k, warmup, repeats, time_limit_s=time_limit_s)
    window = int(getattr(decoder_config(model.config), "max_position_embeddings", 0) or 0)
    over = [c for c in spec.contexts if window and c + ROOM + 2 * k > window]
    if over:
        log(f"note: contexts {over} exceed the shape's window of {window} tokens; measured anyway (cost only)")
    budget = Budget(model.device, parse_bytes(memory_budget) if memory_budget else None)
    built = build_drafters(model, list(methods or []), dict(drafters or {}), method_options)
    try:  # only now: a profile that fails before measuring leaves no directory behind
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create it ({err.strerror})") from None
    device_label = _device_label(model.device)
    label = {"device": device_label, "target": _target_label(model, target_shape), "dtype": str(model.dtype)
             .replace("torch.", "")}
    profile = Profile()
    started = wall()
    log(f"target {label['target']}: {model.num_layers} layers, hidden {model.hidden_size}, vocab "
        f"{model.vocab_size}, {label['dtype']}, {device_label}, layout {model.weight_layout}; budget "
        f"{budget.available() / 2**30:.2f} GiB per point")
    sweep = Sweep(model, built, spec, budget, label, profile, log)
    for context in sorted(spec.contexts):  # context by context, written as it goes (a cut-off run keeps its rows)
        sweep.measure_target(context)
        sweep.measure_drafters(context)
        _write_tables(out, profile)
    profile.facts = {
        "target": label["target"], "target_shape": target_shape, "target_dir": None if target_shape else
        model.model_dir, "config": _config_dict(model.config), "dtype": label["dtype"],
        "weight_layout": model.weight_layout, "weight_layout_choice": model.products_choice,
        "attention_lanes_choice": model.attention_lanes_choice,
        "kv_cache": "static (synthetic K/V fill)",
        "weights_bytes": module_bytes(model.model) + packed_bytes(model), "params": sum(p.numel() for p in model.model.parameters()),
        "kv_bytes_per_token": kv_bytes_per_token(model.config, model.dtype),
        "device_memory_bytes": device_memory(model.device),
        "drafters": {d.label: {**d.method.describe(), "weights_bytes": _drafter_bytes(d.method, model),
                               "state_calibration": d.calibration, "options": {
                                   k_: v for k_, v in d.options.items()}} for d in built},
        "spec": asdict(spec), "budget": budget.describe(), "skipped": [asdict(s) for s in profile.skipped],
        "peak_device_bytes": max([r["peak_bytes"] for r in profile.target_rows + profile.draft_rows
                                  if r.get("peak_bytes") == r.get("peak_bytes")] or [float("nan")]),
        "max_rss_bytes": _max_rss(), "elapsed_s": round(wall() - started, 1),
        "batching": {"method": "batch 1: the method itself, as the engine calls it",
                     "batched": "batch > 1: the method's own modules over a batch axis (evalsuite.profile.batched)",
                     "sequential": "batch > 1: B independent copies one after another (model-free, host work)"},
    }
    _write(out, profile, model, load)
    return profile


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def _target_label(model: TargetModel, target_shape: str | None) -> str:
    if target_shape:
        return f"shape:{model.name}"
    return model.name


def _config_dict(config) -> dict:
    return {k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str, bool, list, dict, type(None)))}


def _drafter_bytes(method: Method, target: TargetModel) -> int:
    """The drafter's own weights (modules shared with the target — embeddings, lm_head — not counted)."""
    model = getattr(method, "model", None)
    if not isinstance(model, torch.nn.Module):
        return 0
    shared = {t.data_ptr() for t in target.model.parameters()}
    return sum(p.numel() * p.element_size() for p in {p.data_ptr(): p for p in model.parameters()}.values()
               if p.data_ptr() not in shared)


def _max_rss() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _write_tables(out: Path, profile: Profile) -> None:
    target = pd.DataFrame(profile.target_rows, columns=TARGET_COLUMNS + EXTRA_TARGET)
    draft = pd.DataFrame(profile.draft_rows, columns=DRAFT_COLUMNS + EXTRA_DRAFT)
    for frame, name in ((target, "target_cost.parquet"), (draft, "draft_cost.parquet")):
        tmp = out / f".{name}.tmp"
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, out / name)


def _write(out: Path, profile: Profile, model: TargetModel, load) -> None:
    from evalsuite.engines.hf import device_facts

    _write_tables(out, profile)
    run = {"kind": "profile", **profile.facts, "environment": {**environment(), **device_facts(model.device),
                                                               "threads": torch.get_num_threads(),
                                                               "contention": load.describe()}}
    tmp = out / ".run.json.tmp"
    tmp.write_text(json.dumps(portable_paths(run), indent=1, default=str))  # no machine paths in run.json
    os.replace(tmp, out / "run.json")
