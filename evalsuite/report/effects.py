"""The context effect *within* trajectories.

Context bins pool turns of different trajectories and turn indices, so a bin's speedup mixes "longer context" with
"a different trajectory" (and, in agent replays, "a later turn"). Here each trajectory is its own control: per
task and method, the paired per-turn log speedup (the method against `ar` on the same turn) and the per-turn τ are
regressed on log context with trajectory fixed effects (the within estimator: x and y demeaned per trajectory), so
the slope only uses how a trajectory's own turns move as its context grows.

- slope_log_speedup: d log(speedup) / d log(context). A slope b means the speedup changes by a factor 2**b per
  doubling of the context (b = 0.1: +7 % per doubling).
- slope_tau: d τ / d log(context) (τ itself, not its log; per doubling: b * ln 2).
- The speedup's fixed effects are (trajectory, machine): a trajectory decoded partly on one machine and partly on
  another (a study resumed across sessions on different hardware) keeps each machine's level apart, so only how
  the speedup moves with context on one machine enters the slope; the clusters stay whole trajectories. τ does not
  depend on the machine and keeps one fixed effect per trajectory. The machine of a turn is its row's
  worker_host/worker_device (on a CPU, with the CPU model since evalsuite records it).
- 95 % interval: percentile cluster bootstrap over trajectories (whole trajectories resampled with replacement;
  a copy drawn twice gets its own fixed effect, so each resample is the same estimator on the resampled set).
- A trajectory with one usable turn (or with all its turns at one context) carries no within information: it
  adds nothing to the slope and is not counted in `n_trajectories`/`n_turns` (which are the slope's n). It is
  still counted in `share_turns_above_1` and `n_turns_all`.
- Within a trajectory the context grows turn by turn, so the slope is the effect of the growing history as an agent
  meets it (a longer context *and* a later turn, with more of its own earlier replies to copy from); it cannot
  separate the two, and it removes everything that differs between trajectories.
- `context_span` is the median over those trajectories of (largest / smallest turn context): the range the slope
  was fitted over. Read a slope per doubling only where the span reaches about 2; BFCL-v3's turns, e.g., span
  ~1.2×, and a slope there extrapolated to a doubling is meaningless (`change_over`).
- No interval below MIN_INTERVAL_TRAJECTORIES trajectories; no slope at all without one trajectory that has
  within information (a single-turn task such as GSM8K: there "context" is only question length, across
  questions, which a within estimator rightly refuses to read as a context effect).

Pure functions of the steps/turns tables (no model, no torch in this module).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import stats

MIN_INTERVAL_TRAJECTORIES = stats.MIN_INTERVAL_TRAJECTORIES

EFFECT_COLUMNS = ["task", "method", "n_trajectories", "n_turns", "slope_log_speedup", "slope_lo", "slope_hi",
                  "slope_tau", "slope_tau_lo", "slope_tau_hi", "share_turns_above_1"]
EFFECT_EXTRA_COLUMNS = ["n_turns_all", "n_trajectories_all", "n_trajectories_tau", "n_turns_tau", "context_min",
                        "context_max", "context_span"]

EFFECT_CONVENTION = (
    "within-trajectory context effect: per task and method, the paired per-turn log speedup (the method's decode "
    "time per token against `ar`'s on the same turn) and the per-turn τ are each regressed on log context with "
    "trajectory fixed effects (x and y demeaned within each trajectory; for the speedup, within each trajectory's "
    "turns on one machine, worker_host/worker_device); slope_log_speedup b means ×2^b per "
    "doubling of the context, slope_tau is the change in τ per unit log context (× ln 2 per doubling); "
    "n_trajectories and n_turns count the trajectories with at least two turns at different contexts, the only "
    "ones that carry within information (within a trajectory context grows with the turn, so the slope is the "
    "effect of the growing history, context and turn position together); context_span = the median over them of "
    "largest / smallest turn context; 95 % intervals by a cluster bootstrap over those trajectories, none below "
    f"{MIN_INTERVAL_TRAJECTORIES}; share_turns_above_1 = share of all paired turns of the cell (n_turns_all) "
    "whose own speedup exceeds 1")


def within_sums(x, y, groups, fixed=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group: (Σ x̃ỹ, Σ x̃², number of observations) with x̃, ỹ demeaned within the group (or within the finer
    cells `fixed`, each nested in one group: a trajectory's turns on one machine), and the group labels.

    Rows where x or y is not finite are dropped first. The within (fixed-effects) slope is Σ Sxy / Σ Sxx over the
    groups; a group with one observation, or all at one x, has Sxx = 0 and carries no information."""
    frame = pd.DataFrame({"x": np.asarray(x, float), "y": np.asarray(y, float), "g": np.asarray(groups),
                          "f": np.asarray(groups if fixed is None else fixed)})
    frame = frame[np.isfinite(frame.x) & np.isfinite(frame.y)]
    if frame.empty:
        empty = np.zeros(0)
        return empty, empty, empty, np.array([], dtype=object)
    grouped = frame.groupby(["g", "f"], sort=False)
    dx = frame.x - grouped.x.transform("mean")
    dy = frame.y - grouped.y.transform("mean")
    sums = pd.DataFrame({"sxy": dx * dy, "sxx": dx * dx, "n": 1.0, "g": frame.g}).groupby("g", sort=False).sum()
    return sums.sxy.to_numpy(), sums.sxx.to_numpy(), sums.n.to_numpy(), sums.index.to_numpy()


def within_slope(x, y, groups, seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES,
                 min_groups: int = MIN_INTERVAL_TRAJECTORIES, fixed=None) -> dict:
    """The fixed-effects slope of y on x with groups as the fixed effects, and its cluster-bootstrap 95 % interval.

    Returns {slope, lo, hi, n_groups, n_obs}: n_groups/n_obs count only the groups with within information
    (Sxx > 0, up to rounding); the interval is NaN with fewer than `min_groups` of them. `fixed`: finer fixed-
    effect cells nested in the groups (`within_sums`); the bootstrap still resamples whole groups."""
    sxy, sxx, n, _ = within_sums(x, y, groups, fixed)
    informative = sxx > 1e-12 * max(1.0, float(sxx.max()) if len(sxx) else 1.0)
    sxy, sxx, n = sxy[informative], sxx[informative], n[informative]
    out = {"slope": float("nan"), "lo": float("nan"), "hi": float("nan"), "n_groups": int(informative.sum()),
           "n_obs": int(n.sum())}
    if not len(sxx):
        return out
    out["slope"] = float(sxy.sum() / sxx.sum())
    if len(sxx) >= min_groups:
        per_unit = np.stack([sxy, sxx], axis=1)
        low, high = stats.bootstrap_ci(per_unit, _slope_from_sums, seed, n_resamples)
        out["lo"], out["hi"] = float(low), float(high)
    return out


def _slope_from_sums(sums: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return sums[..., 0] / sums[..., 1]


def turn_table(steps: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """One row per decoded turn of a drafting method, with its per-turn τ (steps not `budget_limited`), its own
    paired speedup (`speedup_turn`: AR s/token ÷ method s/token on that turn; NaN where unpaired), the trajectory
    key and log context. The rows every function here (and the figure) fits."""
    turns = turns[turns.method != BASELINE]
    steps = steps[steps.method != BASELINE]
    table = metrics.per_turn(steps, turns)
    table["trajectory"] = stats.trajectory_keys(table) if len(table) else pd.Series(dtype=str)
    table["trajectory_machine"] = table.trajectory.astype(str) + "\0" + machine_keys(table)
    with np.errstate(divide="ignore", invalid="ignore"):
        table["log_context"] = np.log(table.context_len.astype(float).where(table.context_len > 0))
        table["log_speedup"] = np.log(table.speedup_turn.astype(float))
    return table


def machine_keys(turns: pd.DataFrame) -> pd.Series:
    """The machine each turn was decoded on: its worker_host and worker_device joined by "/" (the empty ones left
    out; "" where a run recorded neither)."""
    parts = [turns[c].fillna("").astype(str) if c in turns.columns else "" for c in ("worker_host", "worker_device")]
    return (parts[0] + "/" + parts[1] + pd.Series("", index=turns.index, dtype=str)).str.strip("/")


def context_effect(steps: pd.DataFrame, turns: pd.DataFrame, seed: int = 0,
                   n_resamples: int = stats.DEFAULT_RESAMPLES,
                   min_trajectories: int = MIN_INTERVAL_TRAJECTORIES) -> pd.DataFrame:
    """Per (task, method): the within-trajectory slopes of log speedup and of τ on log context, with cluster-
    bootstrap intervals, their n, and the share of paired turns above 1× (columns EFFECT_COLUMNS, then
    EFFECT_EXTRA_COLUMNS). `ar` gets no row (its speedup is 1 by construction)."""
    table = turn_table(steps, turns)
    rows = []
    for (task, method), cell in table.groupby(["task", "method"], sort=False):
        sp = within_slope(cell.log_context, cell.log_speedup, cell.trajectory,
                          stats.cell_seed(seed, "effect-speedup", method, task), n_resamples, min_trajectories,
                          fixed=cell.trajectory_machine)
        ta = within_slope(cell.log_context, cell.tau, cell.trajectory,
                          stats.cell_seed(seed, "effect-tau", method, task), n_resamples, min_trajectories)
        paired_turns = cell[np.isfinite(cell.log_speedup.astype(float))]
        spans = paired_turns.groupby("trajectory").context_len.agg(["min", "max"])
        spans = spans[spans["max"] > spans["min"]]
        rows.append({
            "task": task, "method": method, "n_trajectories": sp["n_groups"], "n_turns": sp["n_obs"],
            "slope_log_speedup": sp["slope"], "slope_lo": sp["lo"], "slope_hi": sp["hi"],
            "slope_tau": ta["slope"], "slope_tau_lo": ta["lo"], "slope_tau_hi": ta["hi"],
            "share_turns_above_1": float((paired_turns.speedup_turn > 1).mean()) if len(paired_turns) else np.nan,
            "n_turns_all": len(paired_turns), "n_trajectories_all": int(paired_turns.trajectory.nunique()),
            "n_trajectories_tau": ta["n_groups"], "n_turns_tau": ta["n_obs"],
            "context_min": int(cell.context_len.min()), "context_max": int(cell.context_len.max()),
            "context_span": float((spans["max"] / spans["min"]).median()) if len(spans) else np.nan,
        })
    return pd.DataFrame(rows, columns=EFFECT_COLUMNS + EFFECT_EXTRA_COLUMNS)


def per_doubling(slope_log_speedup: float) -> float:
    """The relative change of the speedup per doubling of the context implied by a log-log slope (0.07 = +7 %)."""
    return change_over(slope_log_speedup, 2.0)


def change_over(slope_log_speedup: float, span: float) -> float:
    """The relative change of the speedup over a context growth by the factor `span` (e.g. a trajectory's own)."""
    return float(span ** slope_log_speedup - 1.0)


# ---- is a context effect measurable by this design? ------------------------------------------------------------------
MIN_DESIGN_SPAN = 2.0  # a trajectory must grow its context at least ×2 to say anything per doubling
MIN_DESIGN_TRAJECTORIES = 5  # and at least this many trajectories must do so
DESIGN_CONVENTION = (
    f"a within-trajectory context effect is called measurable only where at least {MIN_DESIGN_TRAJECTORIES} "
    f"trajectories of the task grow their context by at least ×{MIN_DESIGN_SPAN:g} from their first to their last "
    "decoded turn; elsewhere the slopes are printed but no verdict reads them as a change with context")


def context_design(turns: pd.DataFrame) -> pd.DataFrame:
    """Per task: whether its design can show a context effect within trajectories (DESIGN_CONVENTION), with the
    numbers behind the decision and the reason in words (columns task, n_trajectories, n_multi_turn,
    n_spanning, median_span, measurable, reason). Spans are over each trajectory's decoded turns (any method)."""
    rows = []
    done = metrics.decoded(turns)
    for task in dict.fromkeys(turns.task):
        own = done[done.task == task]
        keyed = own.drop_duplicates(["run", "sample_id", "turn"]) if len(own) else own
        spans = keyed.groupby(["run", "sample_id"]).context_len.agg(["min", "max", "count"]) if len(keyed) else \
            pd.DataFrame(columns=["min", "max", "count"])
        multi = spans[spans["count"] > 1]
        ratio = (multi["max"] / multi["min"].clip(lower=1)).astype(float)
        spanning = int((ratio >= MIN_DESIGN_SPAN).sum())
        median = float(ratio.median()) if len(ratio) else float("nan")
        measurable = spanning >= MIN_DESIGN_TRAJECTORIES
        if not len(multi):
            reason = "every trajectory has one turn (contexts differ only between samples)"
        elif measurable:
            reason = (f"{spanning} of {len(multi)} trajectories grow their context ×{MIN_DESIGN_SPAN:g} or more "
                      f"(median ×{median:.2f})")
        else:
            reason = (f"only {spanning} of {len(multi)} trajectories grow their context ×{MIN_DESIGN_SPAN:g} or more "
                      f"(median growth ×{median:.2f}; at least {MIN_DESIGN_TRAJECTORIES} are needed)")
        rows.append({"task": task, "n_trajectories": int(len(spans)), "n_multi_turn": int(len(multi)),
                     "n_spanning": spanning, "median_span": median, "measurable": bool(measurable),
                     "reason": reason})
    return pd.DataFrame(rows, columns=["task", "n_trajectories", "n_multi_turn", "n_spanning", "median_span",
                                       "measurable", "reason"])


# ---- the difference of two methods' within-trajectory slopes, paired over trajectories ---------------------------
def slope_difference(x_a, y_a, groups_a, x_b, y_b, groups_b, seed: int = 0,
                     n_resamples: int = stats.DEFAULT_RESAMPLES,
                     min_groups: int = MIN_INTERVAL_TRAJECTORIES, fixed_a=None, fixed_b=None) -> dict:
    """slope(a) − slope(b) of the within (fixed-effects) regressions of y on x, with a PAIRED cluster bootstrap:
    the trajectories (groups) both methods carry within information on are resampled once per resample, and both
    slopes are refitted on that same resample (so what the two share, e.g. a trajectory whose context growth
    slows both, cancels in the difference).

    The reusable test of "does method a hold where method b falls": returns {difference, lo, hi, slope_a, slope_b,
    n_groups, n_obs_a, n_obs_b}; slopes and difference over the shared groups only; no interval below
    `min_groups` shared groups. `fixed_a`/`fixed_b`: finer fixed-effect cells nested in the groups (`within_sums`)."""
    sxy_a, sxx_a, n_a, g_a = within_sums(x_a, y_a, groups_a, fixed_a)
    sxy_b, sxx_b, n_b, g_b = within_sums(x_b, y_b, groups_b, fixed_b)
    a = pd.DataFrame({"sxy": sxy_a, "sxx": sxx_a, "n": n_a}, index=pd.Index(g_a, dtype=object))
    b = pd.DataFrame({"sxy": sxy_b, "sxx": sxx_b, "n": n_b}, index=pd.Index(g_b, dtype=object))
    scale = max(1.0, float(max(a.sxx.max() if len(a) else 0.0, b.sxx.max() if len(b) else 0.0)))
    shared = [g for g in a.index if g in b.index and a.sxx[g] > 1e-12 * scale and b.sxx[g] > 1e-12 * scale]
    out = {"difference": float("nan"), "lo": float("nan"), "hi": float("nan"), "slope_a": float("nan"),
           "slope_b": float("nan"), "n_groups": len(shared), "n_obs_a": int(a.n.reindex(shared).sum()),
           "n_obs_b": int(b.n.reindex(shared).sum())}
    if not shared:
        return out
    per_unit = np.column_stack([a.sxy.reindex(shared), a.sxx.reindex(shared), b.sxy.reindex(shared),
                                b.sxx.reindex(shared)]).astype(float)
    total = per_unit.sum(axis=0)
    out["slope_a"], out["slope_b"] = float(total[0] / total[1]), float(total[2] / total[3])
    out["difference"] = float(_difference_from_sums(total))
    if len(shared) >= min_groups:
        low, high = stats.bootstrap_ci(per_unit, _difference_from_sums, seed, n_resamples)
        out["lo"], out["hi"] = float(low), float(high)
    return out


def _difference_from_sums(sums: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return sums[..., 0] / sums[..., 1] - sums[..., 2] / sums[..., 3]


DIFFERENCE_COLUMNS = ["task", "measure", "method_a", "method_b", "n_trajectories", "slope_a", "slope_b",
                      "difference", "difference_lo", "difference_hi", "separable", "measurable"]
DIFFERENCE_CONVENTION = (
    "slope difference = slope(a) − slope(b) of the within-trajectory regressions (trajectory fixed effects) of the "
    "paired per-turn log speedup (measure log_speedup: ×2^d per doubling of the context, the ratio of a's speedup "
    "to b's) or the per-turn τ (measure tau: τ counts the bonus token; per unit log context) on log context; both "
    "slopes are fitted over the trajectories both methods carry within information on; 95 % interval by a PAIRED "
    "cluster bootstrap: the trajectories are resampled once and both slopes refitted on the same resample; "
    "separable = the interval excludes 0; measurable = the task's design can show a context effect "
    "(context_design); only rows both separable and measurable let a verdict compare two methods' trends")


def slope_differences(steps: pd.DataFrame, turns: pd.DataFrame, seed: int = 0,
                      n_resamples: int = stats.DEFAULT_RESAMPLES, pairs: list[tuple[str, str]] | None = None,
                      min_trajectories: int = MIN_INTERVAL_TRAJECTORIES) -> pd.DataFrame:
    """For every pair of drafting methods on the same task (or the given `pairs`), for log speedup and for τ:
    `slope_difference` over the turn table (DIFFERENCE_COLUMNS)."""
    table = turn_table(steps, turns)
    design = context_design(turns).set_index("task").measurable if len(turns) else pd.Series(dtype=bool)
    rows = []
    for task, cell in table.groupby("task", sort=False):
        methods = list(dict.fromkeys(cell.method))
        wanted = pairs if pairs is not None else [(a, b) for i, a in enumerate(methods) for b in methods[i + 1:]]
        for a, b in wanted:
            one, two = cell[cell.method == a], cell[cell.method == b]
            if one.empty or two.empty:
                continue
            for measure, column, fixed in (("log_speedup", "log_speedup", "trajectory_machine"),
                                           ("tau", "tau", "trajectory")):
                fit = slope_difference(one.log_context, one[column], one.trajectory, two.log_context, two[column],
                                       two.trajectory, stats.cell_seed(seed, "slope-diff", measure, a, b, task),
                                       n_resamples, min_trajectories, one[fixed], two[fixed])
                rows.append({"task": task, "measure": measure, "method_a": a, "method_b": b,
                             "n_trajectories": fit["n_groups"], "slope_a": fit["slope_a"], "slope_b": fit["slope_b"],
                             "difference": fit["difference"], "difference_lo": fit["lo"],
                             "difference_hi": fit["hi"],
                             "separable": bool(np.isfinite(fit["lo"]) and (fit["lo"] > 0 or fit["hi"] < 0)),
                             "measurable": bool(design.get(task, False))})
    return pd.DataFrame(rows, columns=DIFFERENCE_COLUMNS)
