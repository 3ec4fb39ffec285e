"""Figures (PNG + SVG) drawn with matplotlib's Agg canvas, without pyplot's global state.

Every figure is FIG_WIDTH inches wide and saved at one dpi, so fonts are the same size on the page. Each method
keeps one colour, marker and line style in every figure (`Palette`). The look itself is `evalsuite.report.style`."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from evalsuite import conventions, metrics
from evalsuite.report import effects, positions, stats
from evalsuite.report.load import Results
from evalsuite.report.formatting import human_bytes
from evalsuite.report.style import DPI, FIG_WIDTH, STYLE, FigureFile, Palette, count, grid, legend
from evalsuite.conventions import BASELINE


def method_groups(results: Results, methods: list[str]) -> list[tuple[str, list[str]]]:
    """Learned drafters (a checkpoint or weights in run.json) and model-free ones get separate panel rows, so a
    method with a very different range (ngram's τ on repetitive text) does not flatten the others."""
    learned = set()
    for run in results.runs:
        for name, info in (run.config.get("drafters") or {}).items():
            if isinstance(info, dict) and (info.get("checkpoint") or info.get("weights")):
                learned.add(name)
    groups = [("learned drafters", [m for m in methods if m in learned]),
              ("model-free drafters", [m for m in methods if m not in learned])]
    groups = [(label, ms) for label, ms in groups if ms]
    if len(groups) == 1:
        return [("", groups[0][1])]
    return groups


def write_figures(results: Results, summary: pd.DataFrame, curves: pd.DataFrame, costs: pd.DataFrame,
                  directory: Path, seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES,
                  effect: pd.DataFrame | None = None, limits: dict | None = None
                  ) -> tuple[list[FigureFile], list[str]]:
    """Returns the figures written and one line per figure that had no data. `curves` may carry
    `tau_break_even` (drawn on the τ figure); `effect` is `effects.context_effect` (its figure); `limits` is
    `positions.run_limits` (the draft room behind the per-position rates)."""
    directory.mkdir(parents=True, exist_ok=True)
    steps = results.steps
    methods = [m for m in results.methods if m != BASELINE]
    palette = Palette(results.methods)
    drafting = steps[steps.method.isin(methods)]
    groups = method_groups(results, methods)
    turns = metrics.per_turn(drafting, results.turns[results.turns.method.isin(methods)])
    tasks = results.tasks
    builders = [
        ("speedup_vs_context", "Speedup against context, within each task",
         "One panel per task (columns); learned and model-free drafters in separate rows so their ranges do not "
         "squash each other. Bold: the pooled speedup per context bin (quantile bins of the task's turn contexts; "
         "Σ AR time / Σ method time per token over the bin's turns, the table's number) at the bin's median "
         "context, with its 95 % trajectory-bootstrap band; faded lines behind it: each trajectory's per-turn "
         f"speedup; n under each bin = trajectories in it; a band (and a filled marker) only where the bin holds ≥ "
         f"{stats.MIN_INTERVAL_TRAJECTORIES} trajectories and ≥ {stats.MIN_INTERVAL_TURNS} turns, a hollow marker "
         f"otherwise (the point alone; {stats.NO_INTERVAL_NOTE}); a task with one context bin shows its interval as "
         f"an error bar; † = fewer than {stats.MIN_TRAJECTORIES} trajectories; dashed line: AR; "
         "nothing is clipped (a panel whose values span more than 3× has a log scale). Bins mix trajectories and turn positions: the within-trajectory effect "
         "is the next figure.",
         lambda: _context_figure(curves, turns, groups, tasks, palette, "speedup", "speedup over AR (×)")),
        ("context_effect", "Speedup against context within trajectories",
         "Paired per-turn speedup (the method's decode time per token against `ar`'s on the same turn) against "
         "the turn's context, log–log, one faded line per trajectory (its turns in order). Bold: the pooled "
         "within-trajectory slope (trajectory fixed effects) through the centroid of the turns that carry within "
         "information, drawn over the context growth of a typical trajectory (its median span), with its 95 % "
         f"cluster-bootstrap fan (none below {stats.MIN_INTERVAL_TRAJECTORIES} "
         "trajectories); b = d log speedup / d log context (×2^b per doubling). Dashed: 1× (AR). Tasks whose "
         "trajectories have one turn each have no panel; a panel marked \"not measurable here\" is a task whose "
         "trajectories do not grow their context ×2 over at least 5 trajectories (its slope is drawn, not read); "
         "two methods' trends are compared only by the paired slope differences (table below).",
         lambda: context_effect_figure(results.steps, results.turns, effect, methods, tasks, palette)
         if effect is not None else None),
        ("tau_vs_context", "τ against context, within each task, with break-even τ*",
         "As the speedup figure: bold = pooled τ per context bin of the task with its 95 % band (or error bar, "
         f"for a single bin; {stats.NO_INTERVAL_NOTE}), faded = each trajectory's per-turn τ; τ counts the "
         "bonus token. Horizontal dashes, in the method's colour: its break-even τ* in the same "
         "bin (draft + verify ms per step / the target's one-token decode ms): a method whose τ lies above its "
         "dash is faster than `ar` there.",
         lambda: _context_figure(curves, turns, groups, tasks, palette, "tau", "τ")),
        ("cost_vs_context", "Cost against step context: target decode, verify and draft time",
         "Per task (columns), against the step's own context length, in the task's step-context bins (not the "
         "turn-context bins of the figures above): top, the target's forward "
         "(black: the one-token decode of `ar`; coloured: each method's verify of K+1 tokens); middle, the "
         "drafter's time per step; bottom, its draft-state memory (log scale; 0 B not drawn). A speedup trend "
         "follows from verify + draft against decode.", lambda: _cost_figure(costs, methods, tasks, palette)),
        ("tau_vs_turn", "τ against turn index",
         "Token-weighted τ of all steps in the n-th turn of each trajectory, per task (learned and model-free "
         "drafters in separate rows); error bars: 95 % trajectory bootstrap CI, only where the turn index holds ≥ "
         f"{stats.MIN_INTERVAL_TURNS} turns and ≥ {stats.MIN_INTERVAL_TRAJECTORIES} trajectories, a filled marker "
         f"there ({stats.NO_INTERVAL_NOTE}); n under each turn = the turns behind its points (a range where the "
         "panel's methods differ; beyond 12 turns, under the ticked ones); "
         "skipped turns (context limit) have no steps and are counted in the panel title.",
         lambda: _tau_vs_turn(drafting, results.turns, groups, tasks, palette, seed, n_resamples)),
        ("per_position", "Per-position acceptance per task (marginal and conditional)",
         "One row per task: marginal P(1..j all accepted) over every verify step whose budget left room for j "
         "drafts (a drafter that proposed fewer than j counts as not accepted), and conditional P(j accepted | "
         "1..j-1 accepted); the number on every bar is the steps behind it (marginal: steps with room for j; "
         "conditional: steps that reached j); a position never reached has no bar.",
         lambda: _per_position(drafting, results.turns, methods, tasks, palette, limits)),
        ("speedup_per_task", "Speedup per task",
         "Paired AR decode time per token / method decode time per token, pooled over turns; error bars: 95 % "
         f"trajectory bootstrap CI (none below {stats.MIN_INTERVAL_TRAJECTORIES} trajectories); n on each bar = the "
         "paired turns behind it, under each task its trajectories; dashed line: AR.",
         lambda: _speedup_per_task(summary, methods, tasks, palette)),
    ]
    written, skipped = [], []
    with matplotlib.rc_context(STYLE):
        for name, title, caption, build in builders:
            figure = build() if not drafting.empty else None
            if figure is None:
                if name != "context_effect" or drafting.empty:  # no multi-turn context growth: its table says so
                    skipped.append(f"figure {name}: no data of a drafting method to plot")
                continue
            png, svg = directory / f"{name}.png", directory / f"{name}.svg"
            FigureCanvasAgg(figure)
            figure.savefig(png, dpi=DPI, metadata={"Software": None})
            figure.savefig(svg, metadata={"Date": None, "Creator": None})
            written.append(FigureFile(name, title, caption, png, svg))
    return written, skipped


def _context_axis(ax, values) -> None:
    """Log scale when the contexts span more than 3×, with plain-number ticks."""
    values = np.asarray([v for v in values if v > 0], float)
    if len(values) and values.max() > 3 * values.min():
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:,.0f}" if str(round(v))[0] in "25" else ""))
    else:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(3, integer=True))  # 5-digit labels, narrow panels
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.tick_params(axis="x", labelsize=7.5)


def _limits(values: list[np.ndarray]) -> tuple[float, float] | None:
    data = np.concatenate([np.asarray(v, float).ravel() for v in values if len(v)]) if values else np.array([])
    data = data[np.isfinite(data)]
    if not len(data):
        return None
    low, high = float(data.min()), float(data.max())
    pad = 0.08 * (high - low or 1.0)
    return low - pad, high + pad


def _pooled(ax, x, y, with_interval, method: str, style: dict, linewidth: float, markersize: float) -> bool:
    """A method's pooled line: a filled marker where its point has an interval, a hollow one where it has none
    (`stats.interval_allowed`), and an empty line in the full style as the legend's handle for the method.
    Returns whether any point is hollow (the figure's legend then says what that means: `_hollow_key`)."""
    ax.plot([], [], linewidth=linewidth, markersize=markersize, label=method, **style)
    ax.plot(x, y, linewidth=linewidth, zorder=3, label="_pooled", **{**style, "marker": "none"})
    ax.plot(x[with_interval], y[with_interval], linestyle="none", marker=style["marker"], markersize=markersize,
            color=style["color"], zorder=4, label="_with_interval")
    ax.plot(x[~with_interval], y[~with_interval], linestyle="none", marker=style["marker"], markersize=markersize,
            markerfacecolor="white", color=style["color"], zorder=4, label="_no_interval")
    return not with_interval.all()


def _hollow_key(axes, markersize: float) -> None:
    """The legend's last entry: what a hollow marker means (an empty line on the last panel, so it comes last)."""
    axes[-1, -1].plot([], [], linestyle="none", marker="o", markersize=markersize, markerfacecolor="white",
                      color="#555555", label=stats.NO_INTERVAL_NOTE)


# ---- context figures ---------------------------------------------------------------------------------------------
def _context_figure(curves, turns, groups, tasks, palette, measure: str, ylabel: str) -> Figure | None:
    tasks = [t for t in tasks if t in set(curves.task)]
    if curves.empty or not tasks:
        return None
    figure, axes = grid(len(groups), len(tasks))
    per_turn_column = "speedup_turn" if measure == "speedup" else "tau"
    low_col, high_col = f"{measure}_lo", f"{measure}_hi"
    hollow = False
    for r, (label, methods) in enumerate(groups):
        for c, task in enumerate(tasks):
            ax = axes[r, c]
            cells = curves[(curves.task == task) & curves.method.isin(methods)]
            thin = turns[(turns.task == task) & turns.method.isin(methods)]
            pooled_values = [cells[measure].to_numpy(), cells[low_col].to_numpy(), cells[high_col].to_numpy()]
            thin_values = thin[per_turn_column].to_numpy(float)
            for method in methods:
                style = palette.line(method)
                for _, trajectory in thin[thin.method == method].groupby(["run", "sample_id"]):
                    trajectory = trajectory.sort_values("turn")  # faded: the pooled line and band are the message
                    ax.plot(trajectory.context_len, trajectory[per_turn_column], color=style["color"],
                            linewidth=0.5, alpha=0.14, label="_trajectory", zorder=1)
                cell = cells[cells.method == method].sort_values("context_median")
                if cell.empty:
                    continue
                x, y = cell.context_median.to_numpy(float), cell[measure].to_numpy(float)
                low, high = cell[low_col].to_numpy(float), cell[high_col].to_numpy(float)
                banded = (np.isfinite(low) & np.isfinite(high)
                          & stats.interval_allowed(cell.n_turns, cell.n_trajectories))
                if len(x) == 1 and banded[0]:  # one bin: a band has no width to show, an error bar does
                    ax.errorbar(x, y, yerr=np.clip([y - low, high - y], 0, None), fmt="none", ecolor=style["color"],
                                capsize=3, elinewidth=1.2, zorder=2)
                elif banded.any():  # the 95 % band where the bin has enough trajectories and turns for one
                    ax.fill_between(x, np.where(banded, low, y), np.where(banded, high, y), color=style["color"],
                                    alpha=0.18, linewidth=0, zorder=2)
                hollow |= _pooled(ax, x, y, banded, method, style, linewidth=2.0, markersize=5)
                if measure == "tau" and "tau_break_even" in cell.columns and cell.tau_break_even.notna().any():
                    ax.plot(cell.context_median, cell.tau_break_even, color=style["color"], linestyle="none",
                            marker="_", markersize=16, markeredgewidth=2.4, alpha=0.85, label="_break_even")
                    pooled_values.append(cell.tau_break_even.to_numpy(float))
            if measure == "speedup":
                ax.axhline(1.0, color="#555555", linestyle="--", linewidth=0.9)
            elif "tau_break_even" in cells.columns and cells.tau_break_even.notna().any():
                ax.plot([], [], color="#555555", linestyle="none", marker="_", markersize=16, markeredgewidth=2.4,
                        label="τ* (break-even)")
            # nothing clipped: the axis holds every trajectory's values as well as the pooled ones
            limits = _limits(pooled_values + [thin_values] + ([np.array([1.0])] if measure == "speedup" else []))
            data = np.concatenate([np.asarray(v, float).ravel() for v in pooled_values + [thin_values]])
            data = data[np.isfinite(data) & (data > 0)]
            if len(data) and data.max() > 3 * data.min():  # a wide range: log scale, so the pooled lines keep room
                ax.set_yscale("log")
                ax.set_ylim(min(data.min(), 1.0) / 1.08, data.max() * 1.08)
                ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(
                    _nice_ticks(min(data.min(), 1.0) / 1.08, data.max() * 1.08)))
                ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            elif limits is not None:
                ax.set_ylim(*limits)
            _context_axis(ax, np.concatenate([cells.context_median.to_numpy(), thin.context_len.to_numpy(float)]))
            bins = cells.groupby("context_median").n_trajectories.max()
            for i, (x, n) in enumerate(bins.items()):  # staggered: neighbouring bins can sit close together
                ax.annotate(f"n={n}", (x, 0), xycoords=("data", "axes fraction"), xytext=(0, 2 + 8 * (i % 2)),
                            textcoords="offset points", ha="center", va="bottom", fontsize=6.5, color="#56606b")
            ax.set_title(f"{task}\n({_trajectories(thin)})" if r == 0 else "", fontsize=9.5)  # two lines: no overlap
            if c == 0:
                ax.set_ylabel(f"{label}\n{ylabel}" if label else ylabel)
            if r == len(groups) - 1:
                ax.set_xlabel("context (tokens)")
    if hollow:
        _hollow_key(axes, markersize=5)
    legend(figure, axes)
    return figure


def _trajectories(turns: pd.DataFrame) -> str:
    per_method = turns.groupby("method").apply(lambda t: t.groupby(["run", "sample_id"]).ngroups,
                                                include_groups=False) if len(turns) else pd.Series(dtype=int)
    n = int(per_method.max()) if len(per_method) else 0
    noun = "trajectory" if n == 1 else "trajectories"
    return f"n={n} {noun}" + (" †" if n < stats.MIN_TRAJECTORIES else "")


def _cost_figure(costs, methods, tasks, palette) -> Figure | None:
    tasks = [t for t in tasks if t in set(costs.task)]
    if costs.empty or not tasks:
        return None
    figure, axes = grid(3, len(tasks), height=2.4)
    for c, task in enumerate(tasks):
        cells = costs[costs.task == task]
        ar = cells[cells.method == BASELINE].sort_values("context_median")
        if not ar.empty:
            axes[0, c].plot(ar.context_median, ar.verify_ms, color="#222222", marker="x", linewidth=2.2,
                            label=f"{BASELINE}: 1-token decode")
        for method in methods:
            cell = cells[cells.method == method].sort_values("context_median")
            if cell.empty:
                continue
            style = palette.line(method)
            axes[0, c].plot(cell.context_median, cell.verify_ms, label=method, linewidth=1.4, markersize=4, **style)
            axes[1, c].plot(cell.context_median, cell.draft_ms, label=method, linewidth=1.4, markersize=4, **style)
            state = cell.draft_state_bytes.where(cell.draft_state_bytes > 0)
            if state.notna().any():
                axes[2, c].plot(cell.context_median, state, label=method, linewidth=1.4, markersize=4, **style)
        axes[0, c].set_title(task)
        for r in range(3):
            _context_axis(axes[r, c], cells.context_median.to_numpy())
        axes[0, c].set_ylim(bottom=0)
        axes[1, c].set_ylim(bottom=0)
        axes[2, c].set_yscale("log", base=2)
        axes[2, c].yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=4))
        axes[2, c].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: human_bytes(v)))
        axes[2, c].set_xlabel("step context (tokens)")
    axes[0, 0].set_ylabel("target ms / forward")
    axes[1, 0].set_ylabel("draft ms / step")
    axes[2, 0].set_ylabel("draft state")
    legend(figure, axes)
    return figure


# ---- per turn, per position, per task ----------------------------------------------------------------------------
def _tau_vs_turn(steps, turns, groups, tasks, palette, seed, n_resamples) -> Figure | None:
    tasks = [t for t in tasks if not steps[steps.task == t].empty]
    if not tasks:
        return None
    figure, axes = grid(len(groups), len(tasks))
    hollow = False
    for r, (label, methods) in enumerate(groups):
        for c, task in enumerate(tasks):
            ax = axes[r, c]
            behind: dict[int, list[int]] = {}  # turn → the turns behind each method's point there
            for method in methods:
                cell = steps[(steps.method == method) & (steps.task == task)]
                if cell.empty:
                    continue
                curve = stats.tau_curve(cell, cell.turn, stats.cell_seed(seed, "turn", method, task), n_resamples)
                x, y = curve.key.to_numpy(int) + 1, curve.tau.to_numpy(float)
                style = palette.line(method)
                error = np.clip(np.vstack([y - curve.low.to_numpy(float), curve.high.to_numpy(float) - y]), 0, None)
                shown = np.isfinite(error).all(axis=0) & stats.interval_allowed(curve.turns, curve.trajectories)
                if shown.any():
                    ax.errorbar(x[shown], y[shown], yerr=error[:, shown], fmt="none", ecolor=style["color"],
                                capsize=2.5, elinewidth=1.0)
                hollow |= _pooled(ax, x, y, shown, method, style, linewidth=1.4, markersize=4)
                for t, n in zip(x, curve.turns.to_numpy(int)):
                    behind.setdefault(int(t), []).append(int(n))
            if r == 0:
                in_task = (turns.task == task) & turns.method.isin([m for _, ms in groups for m in ms])
                skipped = int((in_task & (turns.stop_reason == conventions.SKIPPED)).sum())
                ax.set_title(task + (f"  ({skipped} turns skipped: context limit)" if skipped else ""))
            turns_here = sorted(steps[steps.task == task].turn.unique() + 1)
            ticks = turns_here if len(turns_here) <= 12 else turns_here[:: -(-len(turns_here) // 12)]
            stagger = len(ticks) > 4  # alternate n one line lower, so neighbouring counts do not run together
            ax.set_xticks(ticks, [f"{t}\n" + ("\n" if stagger and i % 2 else "") + _n_range(behind.get(t, []))
                                  for i, t in enumerate(ticks)])
            ax.tick_params(axis="x", labelsize=7)
            ax.set_xlim(min(turns_here) - 0.5, max(turns_here) + 0.5)
            if c == 0:
                ax.set_ylabel(f"{label}\nτ" if label else "τ")
            if r == len(groups) - 1:
                ax.set_xlabel("turn")
    if hollow:
        _hollow_key(axes, markersize=4)
    legend(figure, axes)
    return figure


def _n_range(counts: list[int]) -> str:
    """The n under a turn: one number when the panel's methods agree, else their range; empty when none."""
    if not counts:
        return ""
    low, high = min(counts), max(counts)
    return f"n={count(low)}" if low == high else f"n={count(low)}–{count(high)}"


def _per_position(steps, turns, methods, tasks, palette, limits) -> Figure | None:
    """One row per task, marginal (left) and conditional (right), the steps behind each bar printed on it (every
    bar: a rate over 3 steps must not look like one over 3,000)."""
    methods = [m for m in methods if (steps[steps.method == m].num_drafted > 0).any()]
    table = positions.position_table(steps[steps.method.isin(methods)], turns, limits, by_tercile=False)
    tasks = [t for t in tasks if t in set(table.task)]
    if table.empty or not tasks:
        return None
    k = int(table.position.max())
    figure, axes = grid(len(tasks), 2, height=2.5)
    width = 0.8 / len(methods)
    for r, task in enumerate(tasks):
        for i, method in enumerate(methods):
            rates = table[(table.task == task) & (table.method == method)]
            if rates.empty:
                continue
            x = rates.position.to_numpy() + (i - (len(methods) - 1) / 2) * width
            for c, (column, column_n) in enumerate((("marginal", "room"), ("conditional", "reached"))):
                shown = rates[column_n].to_numpy() > 0  # a position never reached has no bar (not a bar at 0)
                bars = axes[r, c].bar(x[shown], rates[column].to_numpy()[shown], width=width,
                                      color=palette(method), label=method)
                axes[r, c].bar_label(bars, labels=[count(n) for n in rates[column_n].to_numpy()[shown]],
                                     fontsize=4.6, rotation=90, padding=1.0, color="#3b4550")
        for c, title in enumerate(("marginal: P(1..j all accepted)", "conditional: P(j | 1..j-1)")):
            ax = axes[r, c]
            ax.set_title(f"{task}: {title}", fontsize=8.5)
            ax.set_ylim(0, 1.22)
            ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
            ax.set_xticks(range(1, k + 1))
            if r == len(tasks) - 1:
                ax.set_xlabel("draft position j")
        axes[r, 0].set_ylabel("rate")
    legend(figure, axes)
    return figure


# ---- the within-trajectory context effect --------------------------------------------------------------------------
NICE = (0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 20.0)


def context_effect_figure(steps: pd.DataFrame, turns: pd.DataFrame, effect: pd.DataFrame,
                          methods: list[str] | None = None, tasks: list[str] | None = None,
                          palette: Palette | None = None) -> Figure | None:
    """One row per drafting method, one column per task with within-trajectory information: each trajectory's
    paired per-turn speedups against the turn's context (log–log), and the pooled within slope with its fan."""
    table = effects.turn_table(steps, turns)
    table = table[np.isfinite(table.log_speedup.astype(float)) & np.isfinite(table.log_context.astype(float))]
    with_within = effect[effect.n_trajectories > 0]
    tasks = [t for t in (tasks or list(dict.fromkeys(turns.task))) if t in set(with_within.task)]
    methods = [m for m in (methods or sorted(set(with_within.method))) if m in set(with_within.method)]
    if not tasks or not methods:
        return None
    palette = palette or Palette(methods)
    measurable = dict(zip(*effects.context_design(turns)[["task", "measurable"]].to_numpy().T))
    figure = Figure(figsize=(FIG_WIDTH, 1.9 * len(methods) + 0.6), layout="constrained")
    axes = figure.subplots(len(methods), len(tasks), squeeze=False, sharex="col", sharey="row")
    for r, method in enumerate(methods):
        for c, task in enumerate(tasks):
            ax = axes[r, c]
            cell = table[(table.task == task) & (table.method == method)]
            row = effect[(effect.task == task) & (effect.method == method)]
            style = palette.line(method)
            for _, trajectory in cell.groupby("trajectory", sort=False):
                trajectory = trajectory.sort_values("turn")
                ax.plot(trajectory.context_len, trajectory.speedup_turn, color=style["color"], linewidth=0.6,
                        alpha=0.22, marker=style["marker"], markersize=1.8, label="_trajectory")
            ax.axhline(1.0, color="#555555", linestyle="--", linewidth=0.9)
            if len(row) and np.isfinite(row.slope_log_speedup.iloc[0]):
                _draw_slope(ax, cell, row.iloc[0], style, method, measurable.get(task, True))
            _log_axes(ax, cell.context_len.to_numpy(float))
            if r == 0:
                ax.set_title(task)
            if c == 0:
                ax.set_ylabel(f"{method}\nspeedup")
            if r == len(methods) - 1:
                ax.set_xlabel("turn context (tokens)")
    for r, method in enumerate(methods):  # the row's scale follows its points (and 1×), not the slope's fan
        values = table[table.method == method].speedup_turn.to_numpy(float)
        low, high = min(values.min(initial=1.0), 1.0), max(values.max(initial=1.0), 1.0)
        axes[r, 0].set_ylim(low / 1.15, high * 1.15)
        axes[r, 0].yaxis.set_major_locator(matplotlib.ticker.FixedLocator(_nice_ticks(low / 1.15, high * 1.15)))
    legend(figure, axes)
    return figure


def _nice_ticks(low: float, high: float) -> list[float]:
    inside = [v for v in NICE if low <= v <= high]
    while len(inside) > 6:
        inside = inside[::2] if 1.0 in inside[::2] else inside[1::2]
    return inside


def _log_axes(ax, contexts: np.ndarray) -> None:
    """Both axes logarithmic with plain-number labels (contexts as 2,000, speedups as 1.5×); a narrow context range
    (under 3×) labels every minor tick, a wide one those starting with 2 or 5."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    narrow = len(contexts) and contexts.max() < 3 * contexts.min()
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _: f"{v:,.0f}" if narrow or str(round(v))[0] in "25" else ""))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.tick_params(axis="x", labelsize=7.5, which="both")


def _draw_slope(ax, cell: pd.DataFrame, row, style: dict, method: str, measurable: bool = True) -> None:
    inside = cell.groupby("trajectory").context_len.transform("nunique") > 1
    used = cell[inside]
    if used.empty:
        return
    x0, y0 = float(used.log_context.mean()), float(used.log_speedup.mean())
    # drawn over the span a typical trajectory covers (the slope's support), not across all trajectories' contexts
    half = 0.5 * np.log(row.context_span) if np.isfinite(row.context_span) else 0.0
    xs = np.linspace(max(x0 - half, used.log_context.min()), min(x0 + half, used.log_context.max()), 20)
    b = float(row.slope_log_speedup)
    ax.plot(np.exp(xs), np.exp(y0 + b * (xs - x0)), color=style["color"], linewidth=2.2,
            linestyle=style["linestyle"], label=method)
    label = f"b = {b:+.2f}"
    if np.isfinite(row.slope_lo):
        low, high = y0 + row.slope_lo * (xs - x0), y0 + row.slope_hi * (xs - x0)
        ax.fill_between(np.exp(xs), np.exp(np.minimum(low, high)), np.exp(np.maximum(low, high)),
                        color=style["color"], alpha=0.15, linewidth=0)
        label += f" [{row.slope_lo:+.2f}, {row.slope_hi:+.2f}]"
    label += f"\nn={int(row.n_trajectories)}" + ("" if measurable else " · not measurable here")
    text = ax.text(0.02, 0.97, label, transform=ax.transAxes, ha="left", va="top", fontsize=6.5, color="#2b333b",
                   bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0}, zorder=5)
    text.set_in_layout(False)  # the label sits inside the panel; it must not push the layout


def _speedup_per_task(summary, methods, tasks, palette) -> Figure | None:
    cells = summary[summary.method.isin(methods) & summary.speedup.notna()]
    if cells.empty:
        return None
    tasks = [t for t in tasks if t in set(cells.task)]
    methods = [m for m in methods if m in set(cells.method)]
    figure, axes = grid(1, 1, height=3.0)
    ax = axes[0, 0]
    width = 0.8 / len(methods)
    highest = 0.0
    for i, method in enumerate(methods):
        rows = cells[cells.method == method].set_index("task").reindex(tasks)
        x = np.arange(len(tasks)) + (i - (len(methods) - 1) / 2) * width
        error = np.vstack([rows.speedup - rows.speedup_ci_low, rows.speedup_ci_high - rows.speedup])
        error = np.clip(error, 0, None)
        with_interval = np.isfinite(error).all(axis=0)
        present = rows.speedup.notna().to_numpy()
        ax.bar(x[present], rows.speedup.to_numpy(float)[present], width=width, color=palette(method), label=method)
        ax.errorbar(x[with_interval], rows.speedup.to_numpy()[with_interval], yerr=error[:, with_interval],
                    fmt="none", ecolor="black", capsize=3, elinewidth=1)
        tops = np.fmax(rows.speedup.to_numpy(float), rows.speedup_ci_high.to_numpy(float))
        for xi, top, n in zip(x[present], tops[present], rows.paired_turns.to_numpy()[present]):
            ax.annotate(f"n={count(n)}", (xi, top), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", rotation=90, fontsize=6, color="#3b4550")  # above the bar and its error bar
        highest = max(highest, float(np.nanmax(tops)))
    ax.axhline(1.0, color="#555555", linestyle="--", linewidth=1)
    n = cells.groupby("task").trajectories.max()
    ax.set_xticks(range(len(tasks)), [f"{t}\n({int(n[t])} {'trajectory' if n[t] == 1 else 'trajectories'})"
                                      for t in tasks])
    ax.set_ylabel("speedup over AR (×)")
    ax.set_ylim(0, max(highest, 1.0) * 1.22)  # room for the n above the highest bar
    legend(figure, axes)
    return figure
