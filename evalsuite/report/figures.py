"""Figures (PNG + SVG) drawn with matplotlib's Agg canvas, without pyplot's global state.

Every figure is FIG_WIDTH inches wide and saved at one dpi, so fonts are the same size on the page. Each method
keeps one colour, marker and line style in every figure (`Palette`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from evalsuite import conventions, metrics
from evalsuite.report import stats
from evalsuite.report.load import Results
from evalsuite.report.tables import human_bytes
from evalsuite.conventions import BASELINE

STYLE = {"font.size": 9, "axes.axisbelow": True, "axes.spines.top": False, "axes.spines.right": False,
         "axes.grid": True, "axes.titlesize": 9.5, "legend.fontsize": 9,
         "grid.color": "#e5e5e5", "svg.hashsalt": "evalsuite-report", "svg.fonttype": "none"}
FIG_WIDTH = 10.0  # inches, every figure
DPI = 144
ROW_HEIGHT = 2.9  # inches per row of panels

# Fixed per method name, so a method looks the same in every figure and every report; unknown names get the
# remaining tab10 colours in order. Dashes and markers keep overlapping lines apart.
TAB10 = matplotlib.colormaps["tab10"].colors
KNOWN = {"dlite": (0, "o", "-"), "eagle3": (1, "^", "-"), "dflash": (2, "D", "--"), "dspark": (3, "v", ":"),
         "ngram": (7, "s", "-"), "suffix": (5, "P", "-."), BASELINE: (None, "x", "-")}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":")


@dataclass
class FigureFile:
    name: str
    title: str
    caption: str
    png: Path
    svg: Path


class Palette:
    """One colour, marker and line style per method, the same in every figure."""

    def __init__(self, methods: list[str]):
        taken = {KNOWN[m][0] for m in methods if m in KNOWN and KNOWN[m][0] is not None}
        free = [i for i in range(len(TAB10)) if i not in taken]
        self.styles = {}
        unknown = 0
        for m in methods:
            if m == BASELINE:
                self.styles[m] = ("#222222", "x", "-")
            elif m in KNOWN:
                index, marker, dash = KNOWN[m]
                self.styles[m] = (TAB10[index], marker, dash)
            else:
                self.styles[m] = (TAB10[free[unknown % len(free)]], MARKERS[unknown % len(MARKERS)],
                                  DASHES[unknown % len(DASHES)])
                unknown += 1

    def __call__(self, method: str):
        return self.styles[method][0]

    def line(self, method: str) -> dict:
        colour, marker, dash = self.styles[method]
        return {"color": colour, "marker": marker, "linestyle": dash}


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
                  directory: Path, seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES
                  ) -> tuple[list[FigureFile], list[str]]:
    """Returns the figures written and one line per figure that had no data."""
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
         "squash each other. Bold: pooled speedup per context bin (quantile bins of the task's turn contexts) at "
         "the bin's median context, with 95 % trajectory-bootstrap intervals where the bin holds ≥ 2 trajectories; "
         "thin lines: each trajectory's per-turn speedup; n under each bin = trajectories in it; † = fewer than 5 "
         "trajectories; dashed line: AR.",
         lambda: _context_figure(curves, turns, groups, tasks, palette, "speedup", "speedup over AR (×)")),
        ("tau_vs_context", "τ against context, within each task",
         "As the speedup figure: bold = pooled τ per context bin of the task, thin = each trajectory's per-turn "
         "τ; τ counts the bonus token.",
         lambda: _context_figure(curves, turns, groups, tasks, palette, "tau", "τ")),
        ("cost_vs_context", "Cost against context: target decode, verify and draft time",
         "Per task (columns), against the step's context length in the task's bins: top, the target's forward "
         "(black: the one-token decode of `ar`; coloured: each method's verify of K+1 tokens); middle, the "
         "drafter's time per step; bottom, its draft-state memory (log scale; 0 B not drawn). A speedup trend "
         "follows from verify + draft against decode.", lambda: _cost_figure(costs, methods, tasks, palette)),
        ("tau_vs_turn", "τ against turn index",
         "Token-weighted τ of all steps in the n-th turn of each trajectory, per task (learned and model-free "
         "drafters in separate rows); error bars: 95 % trajectory bootstrap CI (none with one trajectory); "
         "skipped turns (context limit) have no steps and are counted in the panel title.",
         lambda: _tau_vs_turn(drafting, results.turns, groups, tasks, palette, seed, n_resamples)),
        ("per_position", "Per-position acceptance (conditional and marginal)",
         "Conditional P(j accepted | 1..j-1 accepted) and marginal P(1..j all accepted), steps pooled over tasks; "
         "the number on each bar is the steps behind it (conditional: steps that reached j; marginal: steps that "
         "drafted ≥ j tokens); a position never reached has no bar.",
         lambda: _per_position(drafting, methods, palette)),
        ("speedup_per_task", "Speedup per task",
         "Paired AR decode time per token / method decode time per token, pooled over turns; error bars: 95 % "
         "trajectory bootstrap CI (none with one trajectory); dashed line: AR.",
         lambda: _speedup_per_task(summary, methods, tasks, palette)),
    ]
    written, skipped = [], []
    with matplotlib.rc_context(STYLE):
        for name, title, caption, build in builders:
            figure = build() if not drafting.empty else None
            if figure is None:
                skipped.append(f"figure {name}: no data of a drafting method to plot")
                continue
            png, svg = directory / f"{name}.png", directory / f"{name}.svg"
            FigureCanvasAgg(figure)
            figure.savefig(png, dpi=DPI, metadata={"Software": None})
            figure.savefig(svg, metadata={"Date": None, "Creator": None})
            written.append(FigureFile(name, title, caption, png, svg))
    return written, skipped


# ---- shared pieces -----------------------------------------------------------------------------------------------
def _grid(rows: int, columns: int, height: float = ROW_HEIGHT, sharey: str | bool = False):
    figure = Figure(figsize=(FIG_WIDTH, height * rows + 0.5), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False, sharey=sharey)
    return figure, axes


def _legend(figure: Figure, axes) -> None:
    handles, labels = {}, []
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles and not label.startswith("_"):
                handles[label] = handle
                labels.append(label)
    if handles:
        figure.legend([handles[label] for label in labels], labels, loc="outside lower center",
                      ncols=min(len(labels), 7), frameon=False)


def _context_axis(ax, values) -> None:
    """Log scale when the contexts span more than 3×, with plain-number ticks."""
    values = np.asarray([v for v in values if v > 0], float)
    if len(values) and values.max() > 3 * values.min():
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:,.0f}" if str(round(v))[0] in "25" else ""))
    else:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(5, integer=True))
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


# ---- context figures ---------------------------------------------------------------------------------------------
def _context_figure(curves, turns, groups, tasks, palette, measure: str, ylabel: str) -> Figure | None:
    tasks = [t for t in tasks if t in set(curves.task)]
    if curves.empty or not tasks:
        return None
    figure, axes = _grid(len(groups), len(tasks))
    per_turn_column = "speedup_turn" if measure == "speedup" else "tau"
    low_col, high_col = f"{measure}_lo", f"{measure}_hi"
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
                    trajectory = trajectory.sort_values("turn")
                    ax.plot(trajectory.context_len, trajectory[per_turn_column], color=style["color"],
                            linewidth=0.7, alpha=0.35, marker=".", markersize=2.5, label="_trajectory")
                cell = cells[cells.method == method].sort_values("context_median")
                if cell.empty:
                    continue
                ax.plot(cell.context_median, cell[measure], linewidth=2.0, markersize=5, label=method, **style)
                error = np.clip(np.vstack([cell[measure] - cell[low_col], cell[high_col] - cell[measure]]), 0, None)
                shown = np.isfinite(error).all(axis=0)  # a one-trajectory cell has no interval to draw
                if shown.any():
                    ax.errorbar(cell.context_median.to_numpy()[shown], cell[measure].to_numpy()[shown],
                                yerr=error[:, shown], fmt="none", ecolor=style["color"], capsize=2.5, elinewidth=1.0)
            if measure == "speedup":
                ax.axhline(1.0, color="#555555", linestyle="--", linewidth=0.9)
            # the axis follows the pooled values; trajectory lines beyond the 2nd-98th percentile are clipped
            clipped = np.nanpercentile(thin_values, [2, 98]) if np.isfinite(thin_values).any() else []
            limits = _limits(pooled_values + [np.asarray(clipped)] + ([np.array([1.0])] if measure == "speedup"
                                                                           else []))
            if limits is not None:
                ax.set_ylim(*limits)
            _context_axis(ax, np.concatenate([cells.context_median.to_numpy(), thin.context_len.to_numpy(float)]))
            bins = cells.groupby("context_median").n_trajectories.max()
            for x, n in bins.items():
                ax.annotate(f"n={n}", (x, 0), xycoords=("data", "axes fraction"), xytext=(0, 2),
                            textcoords="offset points", ha="center", va="bottom", fontsize=6.5, color="#56606b")
            ax.set_title(f"{task} ({_trajectories(thin)})" if r == 0 else "")
            if c == 0:
                ax.set_ylabel(f"{label}\n{ylabel}" if label else ylabel)
            if r == len(groups) - 1:
                ax.set_xlabel("context (tokens)")
    _legend(figure, axes)
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
    figure, axes = _grid(3, len(tasks), height=2.4)
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
        axes[2, c].set_xlabel("context (tokens)")
    axes[0, 0].set_ylabel("target ms / forward")
    axes[1, 0].set_ylabel("draft ms / step")
    axes[2, 0].set_ylabel("draft state")
    _legend(figure, axes)
    return figure


# ---- per turn, per position, per task ----------------------------------------------------------------------------
def _tau_vs_turn(steps, turns, groups, tasks, palette, seed, n_resamples) -> Figure | None:
    tasks = [t for t in tasks if not steps[steps.task == t].empty]
    if not tasks:
        return None
    figure, axes = _grid(len(groups), len(tasks))
    for r, (label, methods) in enumerate(groups):
        for c, task in enumerate(tasks):
            ax = axes[r, c]
            for method in methods:
                cell = steps[(steps.method == method) & (steps.task == task)]
                if cell.empty:
                    continue
                curve = stats.tau_curve(cell, cell.turn, stats.cell_seed(seed, "turn", method, task), n_resamples)
                x = curve.key.to_numpy() + 1
                style = palette.line(method)
                ax.plot(x, curve.tau, linewidth=1.4, markersize=4, label=method, **style)
                error = np.clip(np.vstack([curve.tau - curve.low, curve.high - curve.tau]), 0, None)
                shown = np.isfinite(error).all(axis=0) & (curve.trajectories.to_numpy() >= 2)
                if shown.any():
                    ax.errorbar(x[shown], curve.tau.to_numpy()[shown], yerr=error[:, shown], fmt="none",
                                ecolor=style["color"], capsize=2.5, elinewidth=1.0)
            if r == 0:
                in_task = (turns.task == task) & turns.method.isin([m for _, ms in groups for m in ms])
                skipped = int((in_task & (turns.stop_reason == conventions.SKIPPED)).sum())
                ax.set_title(task + (f"  ({skipped} turns skipped: context limit)" if skipped else ""))
            turns_here = sorted(steps[steps.task == task].turn.unique() + 1)
            ax.set_xticks(turns_here if len(turns_here) <= 12 else turns_here[:: -(-len(turns_here) // 12)])
            ax.set_xlim(min(turns_here) - 0.5, max(turns_here) + 0.5)
            if c == 0:
                ax.set_ylabel(f"{label}\nτ" if label else "τ")
            if r == len(groups) - 1:
                ax.set_xlabel("turn")
    _legend(figure, axes)
    return figure


def _per_position(steps, methods, palette) -> Figure | None:
    methods = [m for m in methods if (steps[steps.method == m].num_drafted > 0).any()]
    if not methods:
        return None
    k = int(steps.num_drafted.max())
    figure, axes = _grid(1, 2, height=3.2)
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        table = metrics.per_position(steps[steps.method == method], max_position=k)
        x = table.position.to_numpy() + (i - (len(methods) - 1) / 2) * width
        for ax, column, count in zip(axes[0], ("conditional", "marginal"), ("reached", "drafted")):
            shown = table[count].to_numpy() > 0  # a position never reached has no bar (not a bar at 0)
            bars = ax.bar(x[shown], table[column].to_numpy()[shown], width=width, color=palette(method),
                          label=method)
            ax.bar_label(bars, labels=[f"{n:,}" for n in table[count].to_numpy()[shown]], fontsize=5,
                         rotation=90, padding=1.5, color="#3b4550")
    for ax, title in zip(axes[0], ("conditional: P(j accepted | 1..j-1 accepted)", "marginal: P(1..j all accepted)")):
        ax.set_title(title)
        ax.set_xlabel("draft position j")
        ax.set_ylim(0, 1.18)
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.set_xticks(range(1, k + 1))
    axes[0, 0].set_ylabel("acceptance rate")
    _legend(figure, axes)
    return figure


def _speedup_per_task(summary, methods, tasks, palette) -> Figure | None:
    cells = summary[summary.method.isin(methods) & summary.speedup.notna()]
    if cells.empty:
        return None
    tasks = [t for t in tasks if t in set(cells.task)]
    methods = [m for m in methods if m in set(cells.method)]
    figure, axes = _grid(1, 1, height=3.0)
    ax = axes[0, 0]
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        rows = cells[cells.method == method].set_index("task").reindex(tasks)
        x = np.arange(len(tasks)) + (i - (len(methods) - 1) / 2) * width
        error = np.vstack([rows.speedup - rows.speedup_ci_low, rows.speedup_ci_high - rows.speedup])
        error = np.clip(error, 0, None)
        with_interval = np.isfinite(error).all(axis=0)
        ax.bar(x, rows.speedup, width=width, color=palette(method), label=method)
        ax.errorbar(x[with_interval], rows.speedup.to_numpy()[with_interval], yerr=error[:, with_interval],
                    fmt="none", ecolor="black", capsize=3, elinewidth=1)
    ax.axhline(1.0, color="#555555", linestyle="--", linewidth=1)
    n = cells.groupby("task").trajectories.max()
    ax.set_xticks(range(len(tasks)), [f"{t}\n(n={int(n[t])})" for t in tasks])
    ax.set_ylabel("speedup over AR (×)")
    ax.set_ylim(bottom=0)
    _legend(figure, axes)
    return figure
