"""The long-context answer of runs decoded at context points (`--context-points`; benchmarks/long_context_study.sh).

Three pieces, each a pure function of the frames the report already computes:

- `crossings`: per task and method, the context at which the pooled paired speedup crosses 1.0, read from the
  per-point curve (`stats.context_curves`, one bin per point for such runs) by linear interpolation in log context
  between the two points around the crossing, or "not within N tokens" when it never does;
- `published_beside`: the published long-context curves (`baselines/published/context/long_context_curves.csv`:
  speculators #684's EAGLE-3 on Qwen3-8B with and without a sliding window, the seed write-up's 8B drafters, DSpark
  on Kimi-K3) beside our τ at the nearest point, per task;
- `findings`: the study's three questions (does EAGLE-3's τ fall with context here, as published; does a sliding
  window stop it; does DLite's hold), answered only from the within-trajectory slopes (`effects.context_effect`) and
  their paired differences (`effects.slope_differences`): "falls" needs a slope interval below 0, "holds" one that
  covers 0 or lies above it, and "stops it" / "holds where X falls" a paired difference whose interval excludes 0.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from evalsuite.bundled import bundled_path
from evalsuite.report.decisions import format_interval

CURVES_FILE = "baselines/published/context/long_context_curves.csv"
CURVE_REQUIRED = ("source", "target", "method", "variant", "task", "context", "metric", "value")
CROSSING_COLUMNS = ["task", "method", "n_points", "first_point", "last_point", "speedup_first", "speedup_last",
                    "crossing_context", "crossing"]
CROSSING_CONVENTION = (
    "crossing = the context at which the method's pooled paired speedup (decode-only, against `ar` on the same turns) "
    "crosses 1.0: linear in log context between the two context points around the first change of side; 'not within "
    "N' = on one side of 1.0 at every point up to N tokens; point estimates (each point's interval is in the "
    "τ/speedup-by-context table)")
PUBLISHED_CONVENTION = (
    "published = acceptance length (τ, bonus included) of other targets and drafters at a context length, as their "
    "sources report it (different models, hardware and data: a shape to compare against, not a number to match); "
    "ours = τ of the method at our context point nearest to theirs on each task, with its trajectory-bootstrap "
    "interval; '–' where our points do not reach theirs (more than 1.5× away)")
FINDINGS_CONVENTION = (
    "the slopes are within-trajectory (trajectory fixed effects, cluster bootstrap over trajectories): τ per "
    "doubling of the context = slope × ln 2; 'falls' = interval below 0, 'rises' = above 0, 'holds' = covers 0; a "
    "comparison of two methods ('stops it', 'holds where … falls') only where their paired slope difference excludes "
    "0 (`slope_differences`)")


def point_tasks(turns: pd.DataFrame) -> list[str]:
    """The tasks whose every decoded turn was decoded at a context point."""
    if "context_point" not in turns.columns:
        return []
    done = turns[turns.stop_reason != "skipped"] if "stop_reason" in turns.columns else turns
    return [task for task, cell in done.groupby("task", sort=False) if len(cell) and (cell.context_point > 0).all()]


def _crossing(points: np.ndarray, speedups: np.ndarray) -> tuple[float, str]:
    """(the interpolated context of the first crossing of 1.0 or NaN, the sentence)."""
    above = speedups >= 1.0
    last = int(points[-1])
    if above.all():
        return math.nan, f"above 1.0 at every point: not within {last:,} tokens"
    if not above.any():
        return math.nan, f"below 1.0 at every point from {int(points[0]):,}: not within {last:,} tokens"
    i = int(np.flatnonzero(above[1:] != above[:-1])[0])
    a, b, sa, sb = points[i], points[i + 1], speedups[i], speedups[i + 1]
    where = float(math.exp(math.log(a) + (math.log(b) - math.log(a)) * (sa - 1.0) / (sa - sb)))
    direction = "falls below" if sa >= 1.0 else "rises above"
    later = above[i + 1:]
    tail = "" if (later == later[0]).all() else " (and crosses back later)"
    return where, f"{direction} 1.0 at ≈ {where:,.0f} tokens (between {int(a):,} and {int(b):,}){tail}"


def crossings(curves: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """Per (task, method) of the point tasks: where the speedup crosses 1.0 (CROSSING_COLUMNS; CROSSING_CONVENTION).
    `curves`: `stats.context_curves` (for point tasks `context_lo` is the point)."""
    rows = []
    for (task, method), cell in curves[curves.task.isin(tasks)].groupby(["task", "method"], sort=False):
        cell = cell[np.isfinite(cell.speedup)].sort_values("context_lo")
        if cell.empty:
            continue
        points, speedups = cell.context_lo.to_numpy(float), cell.speedup.to_numpy(float)
        where, sentence = _crossing(points, speedups)
        rows.append({"task": task, "method": method, "n_points": len(cell), "first_point": int(points[0]),
                     "last_point": int(points[-1]), "speedup_first": float(speedups[0]),
                     "speedup_last": float(speedups[-1]), "crossing_context": where, "crossing": sentence})
    return pd.DataFrame(rows, columns=CROSSING_COLUMNS)


def load_curves(path=None) -> pd.DataFrame:
    """The published long-context curves (CURVE_REQUIRED columns, `notes` optional); empty when the file is absent."""
    path = bundled_path(CURVES_FILE) if path is None else path
    try:
        frame = pd.read_csv(path, keep_default_na=False)
    except FileNotFoundError:
        return pd.DataFrame(columns=[*CURVE_REQUIRED, "notes"])
    missing = [c for c in CURVE_REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    frame["context"] = pd.to_numeric(frame.context, errors="coerce")
    frame["value"] = frame.value.astype(float)
    return frame


def published_beside(curves: pd.DataFrame, published: pd.DataFrame, tasks: list[str],
                     max_ratio: float = 1.5) -> pd.DataFrame:
    """One row per (published point, our point task): theirs beside our τ at the nearest point of the same method
    (a published sliding-window variant beside our method label that names a window, e.g. eagle3:window=2048)."""
    rows = []
    ours = curves[curves.task.isin(tasks)]
    for r in published.itertuples(index=False):
        windowed = "window" in str(r.variant).lower()
        for task in tasks:
            mine = ours[(ours.task == task) & ours.method.map(
                lambda m: m.split(":")[0] == r.method and (("window=" in m) == windowed))]
            row = {"source": r.source, "target": r.target, "method": r.method, "variant": r.variant,
                   "their_task": r.task, "context": r.context, "their_tau": r.value,
                   "notes": getattr(r, "notes", ""), "task": task, "our_method": None, "our_point": None,
                   "our_tau": np.nan, "our_tau_lo": np.nan, "our_tau_hi": np.nan}
            if len(mine) and np.isfinite(r.context) and r.context > 0:
                gap = (np.log(mine.context_lo.astype(float)) - math.log(r.context)).abs()
                best = mine.loc[gap.idxmin()]
                if math.exp(float(gap.min())) <= max_ratio:
                    row.update(our_method=best.method, our_point=int(best.context_lo), our_tau=float(best.tau),
                               our_tau_lo=float(best.tau_lo), our_tau_hi=float(best.tau_hi))
            rows.append(row)
    return pd.DataFrame(rows)


def _per_doubling(value: float, lo: float, hi: float) -> str:
    """A τ slope per unit log context as '+0.120 [0.050, 0.190]' per doubling (× ln 2)."""
    scale = math.log(2)
    return f"{value * scale:+.3f} {format_interval(lo * scale, hi * scale, 3)}".rstrip()


def _slope_text(row) -> str:
    if not np.isfinite(row.slope_tau):
        return "no within-trajectory slope"
    value, _, rest = _per_doubling(row.slope_tau, row.slope_tau_lo, row.slope_tau_hi).partition(" ")
    return f"{value} τ per doubling {rest}".rstrip()


def _direction(lo: float, hi: float) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "undecided (too few trajectories for an interval)"
    return "falls" if hi < 0 else "rises" if lo > 0 else "holds"


def _difference(differences: pd.DataFrame, task: str, a: str, b: str, measure: str = "tau"):
    """The paired slope difference a − b (sign-corrected when stored as b − a), or None."""
    if differences is None or differences.empty:
        return None
    cell = differences[(differences.task == task) & (differences.measure == measure)]
    for first, second, sign in ((a, b, 1.0), (b, a, -1.0)):
        hit = cell[(cell.method_a == first) & (cell.method_b == second)]
        if len(hit):
            row = hit.iloc[0]
            lo, hi = sorted((sign * row.difference_lo, sign * row.difference_hi))
            return sign * float(row.difference), float(lo), float(hi), bool(row.measurable)
    return None


def findings(effect: pd.DataFrame, differences: pd.DataFrame, curves: pd.DataFrame, tasks: list[str],
             published: pd.DataFrame | None = None, eagle: str = "eagle3", dlite: str = "dlite") -> list[str]:
    """The study's three questions per point task, as sentences (FINDINGS_CONVENTION)."""
    lines = []
    for task in tasks:
        cells = effect[effect.task == task].set_index("method")
        tau_at = curves[curves.task == task].sort_values("context_lo")

        def range_text(method: str) -> str:
            mine = tau_at[tau_at.method == method]
            if mine.empty:
                return ""
            first, last = mine.iloc[0], mine.iloc[-1]
            return (f"τ {first.tau:.2f} at {int(first.context_lo):,} → {last.tau:.2f} at {int(last.context_lo):,}; ")

        parts = []
        if eagle in cells.index:
            row = cells.loc[eagle]
            verdict = _direction(row.slope_tau_lo, row.slope_tau_hi)
            text = f"EAGLE-3's τ {verdict} with context here ({range_text(eagle)}{_slope_text(row)})"
            if published is not None and len(published):
                full = published[(published.method == eagle) & ~published.variant.str.lower().str.contains("window")
                                 & np.isfinite(published.context)]
                series = [g.sort_values("context") for _, g in full.groupby("source", sort=False) if len(g) >= 2]
                if series:  # one source's curve, its first and last point (never two sources joined)
                    a, b = series[0].iloc[0], series[0].iloc[-1]
                    text += (f"; published ({a.source}, {a.target}): {a.value:.2f} at {int(a.context):,} → "
                             f"{b.value:.2f} at {int(b.context):,}")
                    text += ", so as published" if verdict == "falls" else ", unlike the published fall"
            parts.append(text)
            windows = [m for m in cells.index if m.split(":")[0] == eagle and "window=" in m]
            for window in windows:
                wrow = cells.loc[window]
                wverdict = _direction(wrow.slope_tau_lo, wrow.slope_tau_hi)
                text = f"{window}: τ {wverdict} ({range_text(window)}{_slope_text(wrow)})"
                diff = _difference(differences, task, window, eagle)
                if diff is not None and diff[3]:
                    value, lo, hi, _ = diff
                    if lo > 0 and verdict == "falls":
                        text += (f"; the window stops the fall: its slope minus full attention's "
                                 f"{_per_doubling(value, lo, hi)} per doubling")
                    else:
                        text += (f"; not separable from full attention's slope (difference "
                                 f"{_per_doubling(value, lo, hi)} per doubling)")
                parts.append(text)
        if dlite in cells.index:
            row = cells.loc[dlite]
            verdict = _direction(row.slope_tau_lo, row.slope_tau_hi)
            text = f"DLite's τ {verdict} ({range_text(dlite)}{_slope_text(row)})"
            falling = [m for m in cells.index if m != dlite and m.split(":")[0] in ("eagle3", "dflash", "dspark")
                       and _direction(cells.loc[m].slope_tau_lo, cells.loc[m].slope_tau_hi) == "falls"]
            separated, together = [], []
            for other in falling:
                diff = _difference(differences, task, dlite, other)
                if diff is not None and diff[3] and diff[1] > 0:
                    separated.append(f"{other} ({_per_doubling(*diff[:3])})")
                else:
                    together.append(other)
            if verdict in ("holds", "rises") and separated:
                text += ("; it holds where " + ", ".join(separated) + (" falls" if len(separated) == 1 else " fall")
                         + " (DLite's slope minus theirs per doubling, paired over the same trajectories)")
            if together:
                text += ("; " if verdict not in ("holds", "rises") or not separated else "; but ") + \
                    "its slope is not separable from that of " + ", ".join(together) + ", whose τ falls"
            parts.append(text)
        if parts:
            lines.append(f"{task}: " + ". ".join(parts) + ".")
    return lines
