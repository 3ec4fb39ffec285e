"""This answer on other hardware: the runs' measured acceptance (every verify step's drafted and accepted lengths, at
its own context) priced by another machine's costs.

A verdict on speedup mixes two things: how much each method's drafts are accepted (a property of the drafter, the
target and the workload, which carries to any hardware) and what a draft step and a verify block cost against a
one-token decode (a property of the machine). The break-even τ* names the second:

    τ* = (draft ms + verify ms of the block) / decode ms = verify/decode  +  draft/decode
         (the target's verify/decode ratio)   (the drafter's own cost)

On the development CPU the verify of 8 tokens costs 1.4–1.6 decodes; on a memory-bound GPU at batch 1 it costs
about one, so a verdict carried by the ratio does not travel. `projections` prices the same measured steps with
`regime.projected_speedup` on each cost surface:

- a measured profile (`evalsuite profile` output: the committed CPU one, a GPU one when given), costs
  interpolated at each step's context, batch 1; its error is the batch-1 validation of `regime.validate`
  against the runs' measured paired speedup (where the profile was made on the runs' machine);
- `analytic_h100_8b()`: a MODEL, not a measurement: an 8B target of Qwen3-8B's shape on one H100-class GPU,
  memory-bound at batch 1 (ANALYTIC_ASSUMPTIONS). Nothing validates it here: no run was made on that hardware.

What no projection carries: the per-turn work (prefill, the drafter's start of turn), the engine's bookkeeping, and
acceptance itself on another target (the acceptance priced is this target's).

Pure functions (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import regime

HARDWARE_COLUMNS = ["task", "method", "surface", "kind", "k", "context_median", "decode_ms", "verify_ms", "draft_ms",
                    "verify_ratio", "draft_ratio", "tau_break_even", "tau", "speedup_projected", "speedup_measured",
                    "validation_error", "validated_cells", "same_machine", "outside_share"]
HARDWARE_CONVENTION = (
    "τ* = verify/decode + draft/decode on each surface at batch 1, at the method's block of k+1 and the task's median "
    "step context (verify ratio: the target's; draft ratio: the drafter's own cost); projected speedup = "
    "E[tokens per step] × decode / (E[draft] + E[verify of the step's block]) over every measured step of the cell "
    "at its own context (regime.projected_speedup), i.e. the measured acceptance priced by that surface; τ counts "
    "the bonus token; validation error = median |projected − measured| / measured of the batch-1 validation over "
    "the cell's context bins, only for a profile of the machine the runs were made on (an analytic model has none)")

# The analytic model: every number here is an assumption, printed with the table.
GB = 1e9
ANALYTIC_ASSUMPTIONS = {
    "target": "8B dense target of Qwen3-8B's shape (36 layers, H 4096, 8 KV heads × 128, vocab 151,936), bf16",
    "target_weight_bytes": 16.4 * GB,  # 8.2 B parameters × 2 bytes
    "target_params": 8.2e9,
    "kv_bytes_per_token": 2 * 36 * 8 * 128 * 2,  # K and V, 36 layers, 8 heads × 128, bf16: 144 KiB
    "bandwidth": 3.35e12,  # H100 SXM HBM3, bytes/s
    "flops": 989e12 * 0.5,  # dense bf16 peak × an assumed 50 % utilisation
    "forward_overhead_ms": 0.03,  # launch/sync per forward pass (assumed)
}
# Per method: drafter weight bytes read per pass, passes per draft of k (a chain drafter: one per token), the extra
# bytes of its small per-token head passes, and its own KV bytes per context token read per pass. From the published
# architectures at 8B (docs/methods.md and the research notes' cheat sheet), bf16; assumptions, not measurements.
_LAYER = (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) * 2  # one decoder layer of H 4096, I 12288
ANALYTIC_DRAFTERS = {
    "eagle3": {"weights": _LAYER + 3 * 4096 * 4096 * 2 + 32000 * 4096 * 2, "chain": True, "head": 0.0,
               "kv_per_token": 2 * 8 * 128 * 2,
               "shape": "1 layer + fc 3H→H + 32k-vocab head, one pass per drafted token, own KV of 1 layer"},
    "dlite": {"weights": 5 * _LAYER + 7 * 4096 * 4096 * 2, "chain": False, "head": 151936 * 512 * 2,
              "kv_per_token": 0,
              "shape": "5-layer block backbone once + a rank-512 full-vocab head per drafted token; no KV history"},
    "dflash": {"weights": 5 * _LAYER + 5 * 4096 * 4096 * 2 + 151936 * 4096 * 2, "chain": False, "head": 0.0,
               "kv_per_token": 5 * 2 * 8 * 128 * 2,
               "shape": "5 layers + fc 5H→H + the target's head, one block pass, KV of 5 layers over the context"},
    "dspark": {"weights": 5 * _LAYER + 5 * 4096 * 4096 * 2 + 151936 * 4096 * 2 + 151936 * 256 * 2, "chain": False,
               "head": 0.0, "kv_per_token": 5 * 2 * 8 * 128 * 2,
               "shape": "as DFlash plus a rank-256 Markov head, one block pass"},
}
MODEL_FREE_NOTE = "ngram and suffix draft on the host: their draft ms is taken as measured here (the CPU)"


@dataclass
class Surface:
    """Costs at batch 1 as functions of the context (arrays): decode(c), verify(block, c), draft(method, c)."""

    name: str
    kind: str  # "measured profile" | "analytic model"
    decode: Callable
    verify: Callable
    draft: Callable
    validation: pd.DataFrame | None = None  # regime.validate rows, where the profile is of the runs' machine
    notes: list[str] = field(default_factory=list)
    contexts: tuple[float, float] | None = None  # the measured contexts' range; None: a model of any context


def from_profile(cost: regime.CostSurface, runs: regime.RunSteps | None = None, same_machine: bool = False,
                 name: str | None = None) -> Surface:
    """A measured `evalsuite profile` surface at batch 1; with `same_machine`, its batch-1 validation against the
    runs."""
    xd, yd = cost.target_curve(1, 1)
    validation = regime.validate(cost, runs) if runs is not None and same_machine else None

    def verify(block, context):
        xs, ys = cost.target_curve(1, int(block))
        return regime.interp_context(xs, ys, context) if len(xs) else np.full(np.shape(context), np.nan)

    def draft(method, context):
        if method == BASELINE:
            return np.zeros(np.shape(context))
        xs, ys = cost.draft_curve(method, 1)
        return regime.interp_context(xs, ys, context) if len(xs) else np.full(np.shape(context), np.nan)

    return Surface(name or f"profile: {cost.label}", "measured profile", lambda c: regime.interp_context(xd, yd, c),
                   verify, draft, validation, contexts=(float(min(cost.contexts)), float(max(cost.contexts))))


def analytic_h100_8b(host_draft_ms: dict[str, float] | None = None) -> Surface:
    """The memory-bound model of an 8B target on one H100-class GPU at batch 1 (ANALYTIC_ASSUMPTIONS,
    ANALYTIC_DRAFTERS). `host_draft_ms`: the model-free methods' measured draft ms per step (host-side)."""
    a = ANALYTIC_ASSUMPTIONS
    host = dict(host_draft_ms or {})

    def target(block, context):
        context = np.asarray(context, float)
        memory = (a["target_weight_bytes"] + a["kv_bytes_per_token"] * context) / a["bandwidth"]
        compute = 2 * a["target_params"] * float(block) / a["flops"]
        return 1e3 * (memory + compute) + a["forward_overhead_ms"]

    def draft(method, context):
        context = np.asarray(context, float)
        if method == BASELINE:
            return np.zeros(context.shape)
        spec = ANALYTIC_DRAFTERS.get(method)
        if spec is None:
            return np.full(context.shape, host.get(method, np.nan))
        k = 7
        passes = k if spec["chain"] else 1
        per_pass = (spec["weights"] + spec["kv_per_token"] * context) / a["bandwidth"]
        heads = 0.0 if spec["chain"] else k * spec["head"] / a["bandwidth"]
        return 1e3 * (passes * per_pass + heads) + a["forward_overhead_ms"] * (passes + (k if spec["head"] else 0))

    notes = [f"ANALYTIC MODEL, not a measurement: {a['target']}; weights {a['target_weight_bytes'] / GB:.1f} GB, "
             f"KV {a['kv_bytes_per_token'] / 1024:.0f} KiB/token, {a['bandwidth'] / 1e12:.2f} TB/s HBM, "
             f"{a['flops'] / 1e12:.0f} TFLOP/s effective, {a['forward_overhead_ms']} ms per forward; a forward = "
             "(weights + KV bytes) / bandwidth + 2 · params · tokens / FLOP/s + overhead"] + \
            [f"{m}: {s['shape']}" for m, s in ANALYTIC_DRAFTERS.items()] + [MODEL_FREE_NOTE]
    return Surface("analytic: 8B target on one H100-class GPU (memory-bound model)", "analytic model",
                   lambda c: target(1, c), target, draft, None, notes)


def host_draft_ms(steps: pd.DataFrame) -> dict[str, float]:
    """The measured mean draft ms per counted step of the model-free methods (what the analytic model keeps)."""
    out = {}
    for method, cell in steps[steps.method.isin(["ngram", "suffix"])].groupby("method"):
        cell = cell[metrics.counted(cell)]
        out[method] = 1e3 * float(cell.draft_s.mean()) if len(cell) else np.nan
    return out


def outside_share(contexts, measured: tuple[float, float] | None) -> float:
    """The share of steps whose context lies outside a profile's measured range (there its costs are extended
    linearly from the nearest two measured contexts, `regime.interp_context`: an extrapolation); 0 for a model,
    which covers every context."""
    if measured is None:
        return 0.0
    values = np.asarray(contexts, float)
    return float(((values < measured[0]) | (values > measured[1])).mean()) if len(values) else 0.0


def projections(steps: pd.DataFrame, turns: pd.DataFrame, surfaces: list[Surface],
                limits: dict | None = None) -> pd.DataFrame:
    """Per task × drafting method × surface: τ* split into its two ratios, the measured τ, the projected speedup
    of the measured steps, the measured speedup here, and the surface's validation error (HARDWARE_COLUMNS)."""
    rows = []
    drafting = steps[steps.method != BASELINE]
    for surface in surfaces:
        errors = None
        if surface.validation is not None and len(surface.validation):
            errors = surface.validation.assign(abs_error=surface.validation.rel_error.abs())
        for (task, method), cell in drafting.groupby(["task", "method"], sort=False):
            counted = cell[metrics.counted(cell)]
            if counted.empty:
                continue
            k = int((limits or {}).get(str(cell.run.iloc[0]), {}).get("k") or counted.num_drafted.max())
            context = float(np.median(counted.context_len))
            decode = float(np.asarray(surface.decode(np.array([context])))[0])
            verify = float(np.asarray(surface.verify(k + 1, np.array([context])))[0])
            draft = float(np.asarray(surface.draft(method, np.array([context])))[0])
            projected = regime.projected_speedup(counted, lambda c, m=method: surface.draft(m, c), surface.verify,
                                                 surface.decode)
            mine = errors[(errors.task == task) & (errors.method == method)] if errors is not None else None
            rows.append({"task": task, "method": method, "surface": surface.name, "kind": surface.kind, "k": k,
                         "context_median": context, "decode_ms": decode, "verify_ms": verify, "draft_ms": draft,
                         "verify_ratio": verify / decode if decode else np.nan,
                         "draft_ratio": draft / decode if decode else np.nan,
                         "tau_break_even": metrics.tau_break_even(verify + draft, decode),
                         "tau": metrics.tau(counted), "speedup_projected": projected,
                         "speedup_measured": metrics.speedup(turns[(turns.task == task) & (turns.method == method)]),
                         "validation_error": float(mine.abs_error.median()) if mine is not None and len(mine)
                         else np.nan,
                         "validated_cells": int(len(mine)) if mine is not None else 0,
                         "same_machine": surface.validation is not None,
                         "outside_share": outside_share(counted.context_len, surface.contexts)})
    return pd.DataFrame(rows, columns=HARDWARE_COLUMNS)
