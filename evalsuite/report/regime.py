"""Where speculation pays: break-even τ, projected speedup, memory-limited concurrency, and the model's validation.

Pure functions over stored tables (no torch): the cost surfaces of `evalsuite profile` (target_cost.parquet,
draft_cost.parquet, run.json) and, optionally, runs of `evalsuite run` (their steps and turns, read by
`evalsuite.store.run_store.read_run`; τ and speedup by `evalsuite.metrics`).

The model. A method's step drafts, then verifies a block of (drafts + 1) tokens in one target forward, and emits
the accepted drafts plus one. Against one-token decoding at the same batch and context:

    τ*(method, batch, context)        = (draft ms + verify ms of the block of k+1) / decode ms
    projected speedup                 = E[tokens per step] × decode ms / (E[draft ms] + E[verify ms of the block])

where the expectations run over the measured steps of a context bin: a step that drafted n tokens is verified as a
block of n+1 (a model-free drafter that found nothing verifies 1), a step the token budget left without drafts
(`budget_limited`) costs no draft, and every step emits its accepted drafts + 1. `tau_measured` is the usual τ of
those steps (`evalsuite.metrics.tau`). A method pays off at (batch, context) when its projected speedup exceeds 1.

Memory-limited concurrency: streams that fit in the device's memory × `UTILISATION` after the target's and the
drafter's weights, each stream holding the target's KV for the context plus the drafter's state at that context
(draft_cost at batch 1, or the profile's per-token calibration where that point was not measured).

What the projection leaves out: the per-turn work (the prefill, the first token, the drafter's start of turn), the
engine's per-step bookkeeping (acceptance, KV rollback; ~0.5 ms a step on the CPU), a commit of several accepted
tokens instead of one, the hidden states a learned method's verify also returns, any difference in machine load
between the profile and the run; at batch > 1 also ragged acceptance across the batch (the block is as long as its
longest draft, and streams finish at different steps), ragged context lengths, and the scheduler (admission,
prefill interleaved with decodes, preemption). `validate` measures what they add up to at batch 1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError

UTILISATION = 0.9  # of device memory available to weights + KV + drafter state (vLLM's default)
REGIME_COLUMNS = ["method", "batch", "context", "k", "tau_break_even", "tau_measured", "speedup_projected",
                  "max_streams"]
VALIDATION_COLUMNS = ["task", "method", "context_lo", "context_hi", "speedup_measured", "speedup_projected",
                      "rel_error"]
LEFT_OUT = ("the per-turn work (prefill, first token, the drafter's start of turn), the engine's per-step "
            "bookkeeping (acceptance, KV rollback), commits of several accepted tokens, the hidden states a learned "
            "method's verify returns, machine load differing between profile and run; at batch > 1 also ragged "
            "acceptance and context lengths across the batch and the scheduler (admission, prefill interleaving, "
            "preemption)")


# ---- cost surfaces ---------------------------------------------------------------------------------------------
@dataclass
class CostSurface:
    """One profile: target ms per (batch, context, block), draft ms and state per (method, batch, context)."""

    path: Path
    target: pd.DataFrame
    draft: pd.DataFrame
    run: dict
    k: int

    @property
    def label(self) -> str:
        return f"{self.run.get('target', '?')} · {self.run.get('dtype', '?')} · " + \
            str(self.target.device.iloc[0] if len(self.target) else "?")

    @property
    def methods(self) -> list[str]:
        return list(dict.fromkeys(self.draft.method)) if len(self.draft) else []

    @property
    def batches(self) -> list[int]:
        return sorted(int(b) for b in self.target.batch.unique())

    @property
    def contexts(self) -> list[int]:
        return sorted(int(c) for c in self.target.context.unique())

    def target_ms(self, batch: int, context: int, block: int) -> float:
        rows = self._fit(self.target)
        hit = rows[(rows.batch == batch) & (rows.context == context) & (rows.block == block)]
        return float(hit.ms.iloc[0]) if len(hit) else float("nan")

    def draft_row(self, method: str, batch: int, context: int) -> pd.Series | None:
        rows = self._fit(self.draft)
        hit = rows[(rows.method == method) & (rows.batch == batch) & (rows.context == context)]
        return hit.iloc[0] if len(hit) else None

    def draft_ms(self, method: str, batch: int, context: int) -> float:
        if method == BASELINE:
            return 0.0
        row = self.draft_row(method, batch, context)
        return float(row.draft_ms) if row is not None else float("nan")

    def target_curve(self, batch: int, block: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self._fit(self.target)
        rows = rows[(rows.batch == batch) & (rows.block == block)].sort_values("context")
        return rows.context.to_numpy(float), rows.ms.to_numpy(float)

    def draft_curve(self, method: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self._fit(self.draft)
        rows = rows[(rows.method == method) & (rows.batch == batch)].sort_values("context")
        return rows.context.to_numpy(float), rows.draft_ms.to_numpy(float)

    @staticmethod
    def _fit(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[frame.fits.astype(bool)] if "fits" in frame.columns else frame

    def state_per_stream(self, method: str, context: int) -> float:
        """The drafter's state for one stream at `context` tokens (bytes): measured at batch 1, else the per-token
        calibration of run.json extrapolated."""
        if method == BASELINE:
            return 0.0
        row = self.draft_row(method, 1, context)
        if row is not None and row.state_bytes == row.state_bytes:
            return float(row.state_bytes)
        cal = (self.run.get("drafters", {}).get(method) or {}).get("state_calibration")
        if cal:
            return float(cal["per_token"]) * context + float(cal["fixed"])
        return float("nan")

    def drafter_weights(self, method: str) -> float:
        return float((self.run.get("drafters", {}).get(method) or {}).get("weights_bytes") or 0)


def load_cost(path: Path | str) -> CostSurface:
    path = Path(path)
    files = [path / "target_cost.parquet", path / "draft_cost.parquet", path / "run.json"]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise UserError(f"--cost {path}: not a profile directory (missing {', '.join(missing)}); make one with "
                        "`evalsuite profile --out DIR`")
    run = json.loads(files[2].read_text())
    k = int((run.get("spec") or {}).get("k", 7))
    return CostSurface(path, pd.read_parquet(files[0]), pd.read_parquet(files[1]), run, k)


def interp_context(x: np.ndarray, y: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Piecewise linear in the context between measured points, extended linearly beyond them (costs grow about
    linearly with the context); one point is a constant."""
    ok = ~np.isnan(y)
    x, y = x[ok], y[ok]
    at = np.asarray(at, float)
    if len(x) == 0:
        return np.full(at.shape, np.nan)
    if len(x) == 1:
        return np.full(at.shape, y[0])
    out = np.interp(at, x, y)
    low, high = at < x[0], at > x[-1]
    out[low] = y[0] + (at[low] - x[0]) * (y[1] - y[0]) / (x[1] - x[0])
    out[high] = y[-1] + (at[high] - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2])
    return out


# ---- the model -------------------------------------------------------------------------------------------------
def projected_speedup(steps: pd.DataFrame, draft_ms, verify_ms, decode_ms) -> float:
    """E[tokens per step] × decode / (E[draft] + E[verify of the block]) over `steps` (num_accepted, num_drafted,
    budget_limited). `draft_ms(context)`, `verify_ms(block, context)` and `decode_ms(context)` give the costs,
    each a function of arrays (constants work too)."""
    if steps.empty:
        return float("nan")
    context = steps.context_len.to_numpy(float)
    tokens = metrics.step_tokens(steps.num_accepted.to_numpy(float))
    blocks = steps.num_drafted.to_numpy(int) + 1
    drafting = ~steps.budget_limited.fillna(False).to_numpy(bool) if "budget_limited" in steps else \
        np.ones(len(steps), bool)
    draft = np.broadcast_to(np.asarray(draft_ms(context), float), context.shape)
    decode = np.broadcast_to(np.asarray(decode_ms(context), float), context.shape)
    verify = np.zeros(len(steps))
    for block in np.unique(blocks):
        at = blocks == block
        verify[at] = np.broadcast_to(np.asarray(verify_ms(int(block), context[at]), float), at.sum())
    step_ms = np.where(drafting, draft, 0.0) + verify
    if np.isnan(step_ms).any() or np.isnan(decode).any():
        return float("nan")
    return float((tokens * decode).sum() / step_ms.sum())


def max_streams(memory: float, weights: float, kv_per_token: float, context: int, state: float) -> int:
    """Streams of `context` tokens that fit: (memory × UTILISATION − weights) / (KV + drafter state per stream)."""
    free = memory * UTILISATION - weights
    per_stream = kv_per_token * context + state
    if per_stream <= 0 or free <= 0 or per_stream != per_stream:
        return 0
    return int(free // per_stream)


def context_edges(contexts: list[int]) -> np.ndarray:
    """Bin edges around each grid context: geometric midpoints, the first bin from 0, the last to infinity."""
    grid = np.asarray(sorted(contexts), float)
    middles = np.sqrt(grid[:-1] * grid[1:])
    return np.concatenate([[0.0], middles, [np.inf]])


@dataclass
class RunSteps:
    """The measured steps and turns of one or more runs (batch 1)."""

    steps: pd.DataFrame
    turns: pd.DataFrame
    labels: list[str] = field(default_factory=list)
    configs: list[dict] = field(default_factory=list)


def load_runs(paths: list[Path]) -> RunSteps:
    from evalsuite.store.run_store import read_run

    steps, turns, labels, configs = [], [], [], []
    for i, path in enumerate(paths):
        if not (Path(path) / "run.json").is_file():
            raise UserError(f"--run {path}: not a run directory (no run.json)")
        tables = read_run(path)
        key = f"run{i}"
        steps.append(tables.steps.assign(run=key))
        turns.append(tables.turns.assign(run=key))
        labels.append(str(path))
        configs.append(tables.config or {})
    steps_frame = pd.concat(steps, ignore_index=True) if steps else pd.DataFrame()
    turns_frame = pd.concat(turns, ignore_index=True) if turns else pd.DataFrame()
    if len(steps_frame) and "engine" in steps_frame:
        steps_frame = steps_frame[steps_frame.engine.fillna("hf") == "hf"]
    return RunSteps(steps_frame, turns_frame, labels, configs)


def regime_table(cost: CostSurface, runs: RunSteps | None = None, k: int | None = None) -> pd.DataFrame:
    """One row per (method, batch, context) of the surface, `ar` included: break-even τ, measured τ of the runs'
    steps in that context's bin, projected speedup, memory-limited streams; plus the costs behind them."""
    k = k or cost.k
    block = k + 1
    edges = context_edges(cost.contexts)
    memory = float(cost.run.get("device_memory_bytes") or 0)
    weights = float(cost.run.get("weights_bytes") or 0)
    kv = float(cost.run.get("kv_bytes_per_token") or 0)
    rows = []
    for method in [BASELINE] + cost.methods:
        measured = None
        if runs is not None and len(runs.steps):
            measured = runs.steps[runs.steps.method == method]
        for i, context in enumerate(cost.contexts):
            in_bin = None
            if measured is not None and len(measured):
                in_bin = measured[(measured.context_len >= edges[i]) & (measured.context_len < edges[i + 1])]
            streams = max_streams(memory, weights + cost.drafter_weights(method), kv, context,
                                  cost.state_per_stream(method, context))
            for batch in cost.batches:
                decode = cost.target_ms(batch, context, 1)
                draft = cost.draft_ms(method, batch, context)
                verify = cost.target_ms(batch, context, 1 if method == BASELINE else block)
                tau_star = 1.0 if method == BASELINE and decode == decode else \
                    metrics.tau_break_even(draft + verify, decode)
                tau = speedup = float("nan")
                steps_n = 0
                if in_bin is not None and len(in_bin):
                    tau = metrics.tau(in_bin)
                    steps_n = len(in_bin)
                    speedup = projected_speedup(
                        in_bin, lambda c: draft, lambda b, c: cost.target_ms(batch, context, b), lambda c: decode)
                rows.append({"method": method, "batch": batch, "context": context, "k": k,
                             "tau_break_even": tau_star, "tau_measured": tau, "speedup_projected": speedup,
                             "max_streams": streams, "draft_ms": draft, "verify_ms": verify, "decode_ms": decode,
                             "steps_measured": steps_n, "fits": not math.isnan(tau_star)})
    return pd.DataFrame(rows, columns=REGIME_COLUMNS + ["draft_ms", "verify_ms", "decode_ms", "steps_measured",
                                                        "fits"])


def payoff_table(regime: pd.DataFrame) -> pd.DataFrame:
    """Per (method, context): the largest batch of the surface at which the projected speedup is still above 1
    (0 when it pays at no batch), and the projected speedup there and at batch 1."""
    rows = []
    for (method, context), group in regime[regime.method != BASELINE].groupby(["method", "context"], sort=False):
        group = group.sort_values("batch")
        known = group[group.speedup_projected == group.speedup_projected]
        if known.empty:
            continue
        paying = known[known.speedup_projected > 1.0]
        rows.append({"method": method, "context": context, "tau_measured": known.tau_measured.iloc[0],
                     "speedup_batch1": known.speedup_projected.iloc[0],
                     "max_batch_paying": int(paying.batch.max()) if len(paying) else 0,
                     "speedup_there": float(paying.speedup_projected.iloc[-1]) if len(paying) else float("nan"),
                     "largest_batch_measured": int(known.batch.max())})
    return pd.DataFrame(rows, columns=["method", "context", "tau_measured", "speedup_batch1", "max_batch_paying",
                                       "speedup_there", "largest_batch_measured"])


def concurrency_table(regime: pd.DataFrame, cost: CostSurface) -> pd.DataFrame:
    """Per (method, context): streams that fit, the drafter's state per stream, and streams relative to `ar` (the
    target alone) and to DLite (the paper's "quadruple concurrency" claim: DLite's streams ÷ another method's)."""
    first = regime.drop_duplicates(["method", "context"])[["method", "context", "max_streams"]]
    pivot = first.pivot(index="context", columns="method", values="max_streams")
    rows = []
    for _, row in first.iterrows():
        ar = pivot.loc[row.context].get(BASELINE, np.nan)
        dlite = pivot.loc[row.context].get("dlite", np.nan)
        rows.append({"method": row.method, "context": row.context, "max_streams": row.max_streams,
                     "state_bytes_per_stream": cost.state_per_stream(row.method, int(row.context)),
                     "vs_ar": row.max_streams / ar if ar else float("nan"),
                     "dlite_vs_this": dlite / row.max_streams if row.max_streams else float("nan")})
    return pd.DataFrame(rows)


# ---- validation ------------------------------------------------------------------------------------------------
def validate(cost: CostSurface, runs: RunSteps, edges: list[int] | None = None) -> pd.DataFrame:
    """Batch 1: per (task, method, context bin of the turns' context), the runs' measured paired speedup (pooled,
    `evalsuite.metrics.speedup`) against the projection from the cost surface (costs interpolated at each step's
    own context) and the same turns' steps."""
    if runs is None or runs.turns.empty:
        return pd.DataFrame(columns=VALIDATION_COLUMNS)
    grid = sorted(edges or cost.contexts)
    if len(grid) < 2:
        raise UserError("validation needs a cost surface with at least two contexts (bin edges)")
    turns = metrics.decoded(runs.turns)
    steps = runs.steps
    xd, yd = cost.target_curve(1, 1)
    keys = ["run", "method", "task", "sample_id", "turn"]
    rows = []
    for method in [m for m in cost.methods if m in set(turns.method)]:
        xs, ys = cost.draft_curve(method, 1)
        for task, mine in turns[turns.method == method].groupby("task"):
            for lo, hi in zip(grid[:-1], grid[1:]):
                last = hi == grid[-1]
                chosen = mine[(mine.context_len >= lo) & ((mine.context_len <= hi) if last else (mine.context_len < hi))]
                paired = metrics.paired(chosen)
                if paired.empty:
                    continue
                wanted = paired[keys].drop_duplicates()
                bin_steps = steps.merge(wanted, on=keys, how="inner")
                measured = metrics.speedup(paired)
                projected = projected_speedup(
                    bin_steps, lambda c: interp_context(xs, ys, c),
                    lambda b, c: interp_context(*cost.target_curve(1, b), c), lambda c: interp_context(xd, yd, c))
                rows.append({"task": task, "method": method, "context_lo": lo, "context_hi": hi,
                             "speedup_measured": measured, "speedup_projected": projected,
                             "rel_error": (projected - measured) / measured if measured else float("nan"),
                             "turns": len(paired), "steps": len(bin_steps), "tau": metrics.tau(bin_steps)})
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS + ["turns", "steps", "tau"])


def validation_summary(table: pd.DataFrame) -> str:
    drafting = table[table.method != BASELINE]
    if drafting.empty:
        return "no paired turns to validate against"
    errors = drafting.rel_error.abs().dropna()
    return (f"median |rel_error| {100 * errors.median():.1f} % over {len(errors)} (task, method, context bin) cells "
            f"(max {100 * errors.max():.1f} %; target ≤ 10 %)")


def check_same_shape(cost: CostSurface, runs: RunSteps) -> list[str]:
    """Notes where a run was not made on what the surface measured (another target, dtype, layout, drafters)."""
    notes = []
    for label, config in zip(runs.labels, runs.configs):
        if config.get("target_name") and cost.run.get("target") and \
                config.get("target_name") != cost.run.get("target") and not str(cost.run.get("target")).endswith(
                    str(config.get("target_name"))):
            notes.append(f"{label}: target {config.get('target_name')} is not the profiled {cost.run.get('target')}")
        for key in ("dtype", "weight_layout"):
            if config.get(key) and cost.run.get(key) and config.get(key) != cost.run.get(key):
                notes.append(f"{label}: {key} {config.get(key)} differs from the profile's {cost.run.get(key)}")
        shas = config.get("drafter_sha256") or {}
        for method, info in (cost.run.get("drafters") or {}).items():
            theirs = shas.get(method)
            ours = info.get("checkpoint_sha256")
            if theirs and ours != theirs:
                notes.append(f"{label}: {method} ran with drafter {theirs[:12]}…, the profile timed "
                             f"{(ours or 'a random-init one')[:12]}: costs are of another architecture unless sizes "
                             "match")
        load = config.get("contention") or {}
        if load.get("contended"):
            notes.append(f"{label}: the run was made on a contended machine (run.json contention)")
    load = (cost.run.get("environment") or {}).get("contention") or {}
    if load.get("contended"):
        notes.append("the profile was made on a contended machine (run.json environment.contention)")
    return notes


# ---- output ----------------------------------------------------------------------------------------------------
@dataclass
class RegimeResult:
    regime: pd.DataFrame
    payoff: pd.DataFrame
    concurrency: pd.DataFrame
    validation: pd.DataFrame
    notes: list[str]
    files: list[Path]


def write_regime(cost_dir: Path, run_dirs: list[Path], out: Path, k: int | None = None) -> RegimeResult:
    cost = load_cost(cost_dir)
    blocks = sorted(int(b) for b in cost.target.block.unique()) if len(cost.target) else []
    if k is not None and (k < 1 or k + 1 not in blocks):
        raise UserError(f"--k {k}: the profile measured verify blocks {blocks}; τ* for k needs block k+1 "
                        f"(profile again with --k {k})")
    runs = load_runs(run_dirs) if run_dirs else None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create it ({err.strerror})") from None
    regime = regime_table(cost, runs, k)
    payoff = payoff_table(regime)
    concurrency = concurrency_table(regime, cost)
    validation = validate(cost, runs) if runs is not None else pd.DataFrame(columns=VALIDATION_COLUMNS)
    notes = check_same_shape(cost, runs) if runs is not None else []
    if runs is not None and len(runs.turns):
        decoded = metrics.decoded(runs.turns)
        decoded = decoded[decoded.method.isin(cost.methods)]
        lo, hi = min(cost.contexts), max(cost.contexts)
        outside = int(((decoded.context_len < lo) | (decoded.context_len > hi)).sum())
        if outside:
            notes.append(f"{outside} of {len(decoded)} decoded turns start outside the profiled contexts {lo}–{hi} "
                         "and are not in the validation (profile a wider range to include them)")
    files = []
    for frame, name in ((regime, "regime.csv"), (payoff, "payoff.csv"), (concurrency, "concurrency_memory.csv")):
        frame.to_csv(out / name, index=False)
        files.append(out / name)
    if runs is not None:
        validation.to_csv(out / "regime_validation.csv", index=False)
        files.append(out / "regime_validation.csv")
    files += heatmaps(regime, cost, out)
    (out / "regime.md").write_text(markdown(cost, regime, payoff, concurrency, validation, notes, runs))
    files.append(out / "regime.md")
    return RegimeResult(regime, payoff, concurrency, validation, notes, files)


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}f}"


def _table(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_fmt(row[c]) if not isinstance(row[c], str) else row[c] for c in columns)
                     + " |")
    return lines


def markdown(cost: CostSurface, regime, payoff, concurrency, validation, notes, runs) -> str:
    lines = [f"# Where speculation pays: {cost.label}", "",
             "τ* = (draft + verify of k+1) ÷ decode at each batch and context (random weights: costs only); "
             "projected speedup = E[tokens per step] × decode ÷ (E[draft] + E[verify of the block]) with the runs' "
             "measured acceptance in each context bin.", ""]
    lines += ["## Break-even τ (rows: method × batch; columns: context)", ""]
    pivot = regime.pivot_table(index=["method", "batch"], columns="context", values="tau_break_even", sort=False,
                               dropna=False)
    header = ["method", "batch"] + [str(c) for c in pivot.columns]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (method, batch), values in pivot.iterrows():
        lines.append(f"| {method} | {batch} | " + " | ".join(_fmt(v) for v in values) + " |")
    if regime.speedup_projected.notna().any():
        lines += ["", "## Projected speedup with the measured τ", ""]
        pivot = regime.pivot_table(index=["method", "batch"], columns="context", values="speedup_projected",
                                   sort=False, dropna=False)
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for (method, batch), values in pivot.iterrows():
            lines.append(f"| {method} | {batch} | " + " | ".join(_fmt(v) for v in values) + " |")
        lines += ["", "## The largest batch that still pays", ""]
        lines += _table(payoff, list(payoff.columns))
    lines += ["", f"## Memory-limited concurrency ({UTILISATION:.0%} of "
              f"{float(cost.run.get('device_memory_bytes') or 0) / 2**30:.0f} GiB; target KV "
              f"{float(cost.run.get('kv_bytes_per_token') or 0) / 1024:.1f} KiB/token)", ""]
    lines += _table(concurrency, list(concurrency.columns))
    if runs is not None:
        lines += ["", "## Validation at batch 1 (projected vs the runs' measured paired speedup)", "",
                  validation_summary(validation), ""]
        lines += _table(validation, list(validation.columns))
        lines += ["", f"Left out of the projection: {LEFT_OUT}."]
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def heatmaps(regime: pd.DataFrame, cost: CostSurface, out: Path) -> list[Path]:
    """Two figures, one panel per method over batch × context: break-even τ (a triangle where the runs' measured τ
    clears it) and projected speedup (diverging at 1; a dot at the runs' own batch; grey: no measured τ in that
    context bin). Cells that did not fit in memory are hatched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    methods = [m for m in regime.method.unique() if m != BASELINE]
    if not methods:
        return []
    files = []
    for value, title, name in (("tau_break_even", "break-even τ", "regime_tau_break_even"),
                               ("speedup_projected", "projected speedup", "regime_speedup")):
        if regime[value].isna().all():
            continue
        columns = min(len(methods), 3)
        rows_n = math.ceil(len(methods) / columns)
        figure = Figure(figsize=(4.2 * columns, 3.2 * rows_n), layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(rows_n, columns, squeeze=False)
        finite = regime[value].replace([np.inf, -np.inf], np.nan).dropna()
        if value == "speedup_projected":
            low, high = min(finite.min(), 0.99), max(finite.max(), 1.01)
            norm, cmap = TwoSlopeNorm(vcenter=1.0, vmin=low, vmax=high), "RdBu"
        else:
            norm, cmap = None, "viridis"
        image = None
        for ax, method in zip(axes.flat, methods):
            mine = regime[regime.method == method]
            grid = mine.pivot_table(index="batch", columns="context", values=value, dropna=False)
            data = grid.to_numpy(float)
            fits = mine.pivot_table(index="batch", columns="context", values="tau_break_even",
                                    dropna=False).notna().to_numpy()
            image = ax.imshow(data, origin="lower", aspect="auto", cmap=cmap, norm=norm,
                              vmin=None if norm else np.nanmin(finite), vmax=None if norm else np.nanmax(finite))
            ax.set_facecolor("#eeeeee")  # no measured τ in this context bin
            for (i, j), cell in np.ndenumerate(data):
                if not fits[i, j]:
                    ax.add_patch(_hatch(j, i))  # did not fit in memory (or was not measured)
                if cell != cell:
                    continue
                ax.text(j, i, f"{cell:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if value == "tau_break_even" else "black")
            if value == "tau_break_even":  # measured τ clears the break-even here
                tau = mine.pivot_table(index="batch", columns="context", values="tau_measured", dropna=False)
                pays = tau.to_numpy(float) > data
                ys, xs = np.nonzero(pays)
                ax.scatter(xs - 0.32, ys - 0.3, s=18, marker="^", c="#ff6600", label="measured τ ≥ τ*")
            else:  # the measured points: the runs' own batch (1), with their τ
                tau = mine[(mine.batch == mine.batch.min()) & mine.tau_measured.notna()]
                cols = list(grid.columns)
                ax.scatter(np.array([cols.index(c) for c in tau.context]) - 0.32, [-0.3] * len(tau), marker="o",
                           s=14, c="black", label="measured (the runs' batch)")
            ax.set_xticks(range(grid.shape[1]), [_short(c) for c in grid.columns], fontsize=7)
            ax.set_yticks(range(grid.shape[0]), [str(b) for b in grid.index], fontsize=7)
            ax.set_xlabel("context (tokens)", fontsize=8)
            ax.set_ylabel("batch", fontsize=8)
            ax.set_title(method, fontsize=9)
        for ax in list(axes.flat)[len(methods):]:
            ax.set_visible(False)
        if image is not None:
            figure.colorbar(image, ax=axes, shrink=0.8, label=title)
        figure.suptitle(f"{title} — {cost.label}", fontsize=10)
        for suffix in ("png", "svg"):
            path = out / f"{name}.{suffix}"
            figure.savefig(path, dpi=110)
            files.append(path)
    return files


def _hatch(x: int, y: int):
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, hatch="xx", edgecolor="#999999", linewidth=0)


def _short(context: int) -> str:
    return f"{context // 1024}k" if context >= 1024 and context % 1024 == 0 else str(context)


# ---- the report hook -------------------------------------------------------------------------------------------
def add_to_report(report_dir: Path, run_dirs: list[Path], cost_dir: Path) -> list[Path]:
    """`evalsuite report … --cost DIR`: the regime tables and figures under REPORT/regime/, and a section that links
    them appended to report.md and index.html (when the report wrote them)."""
    result = write_regime(cost_dir, run_dirs, report_dir / "regime")
    section_md = ["", "## Where speculation pays (cost surfaces)", "",
                  f"Cost surface `{cost_dir.name}`; tables and figures in `regime/` "
                  f"([regime.md](regime/regime.md)).", ""]
    if not result.validation.empty:
        section_md.append(f"Validation at batch 1: {validation_summary(result.validation)}.")
    section_md += ["", "![break-even τ](regime/regime_tau_break_even.png)", ""]
    report_md = report_dir / "report.md"
    if report_md.exists():
        report_md.write_text(report_md.read_text() + "\n".join(section_md) + "\n")
    index = report_dir / "index.html"
    if index.exists():
        import html as html_lib

        figures = "".join(f'<p><img src="regime/{p.name}" style="max-width:100%"></p>'
                          for p in result.files if p.suffix == ".png")
        summary = html_lib.escape(validation_summary(result.validation)) if not result.validation.empty else ""
        block = (f'<h2 id="regime">Where speculation pays (cost surfaces)</h2><p>Cost surface '
                 f'<code>{html_lib.escape(cost_dir.name)}</code>: <a href="regime/regime.md">regime.md</a>, '
                 f'<a href="regime/regime.csv">regime.csv</a>. {summary}</p>{figures}')
        page = index.read_text()
        page = page.replace("</body>", block + "</body>", 1) if "</body>" in page else page + block
        index.write_text(page)
    return result.files
