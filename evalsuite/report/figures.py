"""Figures (PNG + SVG) drawn with matplotlib's Agg canvas, without pyplot's global state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from evalsuite.report import stats
from evalsuite.report.load import Results
from evalsuite.report.tables import human_bytes
from evalsuite.runner import BASELINE

STYLE = {"font.size": 10, "axes.axisbelow": True, "axes.spines.top": False, "axes.spines.right": False,
         "axes.grid": True,
         "grid.color": "#e5e5e5", "svg.hashsalt": "evalsuite-report", "svg.fonttype": "none"}


@dataclass
class FigureFile:
    name: str
    title: str
    caption: str
    png: Path
    svg: Path


class Palette:
    """One colour per method, the same in every figure."""

    def __init__(self, methods: list[str]):
        colours = matplotlib.colormaps["tab10"].colors
        self.colours = {m: colours[i % len(colours)] for i, m in enumerate(methods)}

    def __call__(self, method: str):
        return self.colours[method]


def write_figures(results: Results, summary: pd.DataFrame, directory: Path, seed: int = 0,
                  n_resamples: int = stats.DEFAULT_RESAMPLES) -> tuple[list[FigureFile], list[str]]:
    """Returns the figures written and one line per figure that had no data."""
    directory.mkdir(parents=True, exist_ok=True)
    steps = results.steps
    methods = [m for m in results.methods if m != BASELINE]
    palette = Palette(methods)
    drafting = steps[steps.method.isin(methods)]
    written, skipped = [], []
    builders = [
        ("tau_vs_turn", "τ against turn index",
         "Token-weighted τ of all steps in the n-th turn of each trajectory, per task; bands: 95 % trajectory "
         "bootstrap CI; skipped turns (context limit) have no steps and are counted in the panel title.",
         lambda: _tau_vs_turn(drafting, results.turns, methods, results.tasks, palette, seed, n_resamples)),
        ("tau_vs_context", "τ against context length",
         "Token-weighted τ of the steps whose context (target KV length) falls in each log-spaced bin, all tasks "
         "pooled; bands: 95 % trajectory bootstrap CI.",
         lambda: _tau_vs_context(drafting, methods, palette, seed, n_resamples)),
        ("per_position", "Per-position acceptance",
         "Conditional P(j accepted | 1..j-1 accepted) and marginal P(1..j all accepted); only steps that drafted at "
         "least j tokens count at position j.", lambda: _per_position(drafting, methods, palette)),
        ("draft_cost_vs_context", "Draft time and draft-state memory against context length",
         "Mean draft time per step and mean draft-state bytes (log scale; 0 B not drawn) per log-spaced context "
         "bin. A history-free drafter (DLite) should stay flat.", lambda: _cost_vs_context(drafting, methods, palette)),
        ("speedup_per_task", "Speedup per task",
         "Paired AR decode time per token / method decode time per token, pooled over turns; error bars: 95 % "
         "trajectory bootstrap CI; dashed line: AR.", lambda: _speedup_per_task(summary, methods, results.tasks,
                                                                                palette)),
    ]
    with matplotlib.rc_context(STYLE):
        for name, title, caption, build in builders:
            figure = build() if not drafting.empty else None
            if figure is None:
                skipped.append(f"figure {name}: no data of a drafting method to plot")
                continue
            png, svg = directory / f"{name}.png", directory / f"{name}.svg"
            FigureCanvasAgg(figure)
            figure.savefig(png, dpi=144, bbox_inches="tight", metadata={"Software": None})
            figure.savefig(svg, bbox_inches="tight", metadata={"Date": None, "Creator": None})
            written.append(FigureFile(name, title, caption, png, svg))
    return written, skipped


# ---- shared pieces -----------------------------------------------------------------------------------------------
def _panels(count: int, width: float = 4.2, height: float = 3.2, max_columns: int = 3):
    columns = min(count, max_columns)
    rows = -(-count // columns)
    figure = Figure(figsize=(width * columns, height * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for extra in axes[count:]:
        extra.set_visible(False)
    return figure, axes[:count]


def _legend(figure: Figure, axes) -> None:
    handles, labels = {}, []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    if handles:
        figure.legend([handles[label] for label in labels], labels, loc="outside lower center",
                      ncols=min(len(labels), 6), frameon=False)


def _line_with_band(ax, x, curve: pd.DataFrame, colour, label: str) -> None:
    """The point estimates joined by a line, the CI as a band (and as error bars, visible even for one point)."""
    low = np.clip(curve.tau - curve.low, 0, None)
    high = np.clip(curve.high - curve.tau, 0, None)
    ax.errorbar(x, curve.tau, yerr=np.nan_to_num(np.vstack([low, high])), color=colour, marker="o", capsize=3,
                label=label)
    if len(x) > 1:
        ax.fill_between(x, curve.low, curve.high, color=colour, alpha=0.18, linewidth=0)


def _context_axis(ax, centers: np.ndarray) -> None:
    """Log scale with the bin centres as plain-number ticks."""
    ax.set_xscale("log")
    ax.set_xticks(centers, [f"{int(round(c)):,}" for c in centers], rotation=30)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


# ---- the figures -----------------------------------------------------------------------------------------------
def _tau_vs_turn(steps, turns, methods, tasks, palette, seed, n_resamples) -> Figure | None:
    tasks = [t for t in tasks if not steps[steps.task == t].empty]
    if not tasks:
        return None
    figure, axes = _panels(len(tasks))
    for ax, task in zip(axes, tasks):
        for method in methods:
            cell = steps[(steps.method == method) & (steps.task == task)]
            if cell.empty:
                continue
            curve = stats.tau_curve(cell, cell.turn, stats.cell_seed(seed, "turn", method, task), n_resamples)
            _line_with_band(ax, curve.key.to_numpy() + 1, curve, palette(method), method)
        in_task = (turns.task == task) & turns.method.isin(methods)
        skipped = int((in_task & (turns.stop_reason == stats.SKIPPED)).sum())
        ax.set_title(task + (f"  ({skipped} turns skipped: context limit)" if skipped else ""))
        turns_here = sorted(steps[steps.task == task].turn.unique() + 1)
        ax.set_xlabel("turn")
        ax.set_ylabel("τ", rotation=0, labelpad=10)
        ax.set_xticks(turns_here if len(turns_here) <= 12 else turns_here[:: -(-len(turns_here) // 12)])
        ax.set_xlim(min(turns_here) - 0.5, max(turns_here) + 0.5)
    _legend(figure, axes)
    return figure


def _tau_vs_context(steps, methods, palette, seed, n_resamples) -> Figure | None:
    edges = stats.context_bins(steps.context_len)
    centers = np.sqrt(np.maximum(edges[:-1], 1.0) * edges[1:])
    figure, (ax,) = _panels(1, width=6.0, height=3.8)
    for method in methods:
        cell = steps[steps.method == method]
        if cell.empty:
            continue
        curve = stats.tau_curve(cell, stats.bin_index(cell.context_len, edges),
                                stats.cell_seed(seed, "context", method), n_resamples)
        _line_with_band(ax, centers[curve.key.to_numpy()], curve, palette(method), method)
    _context_axis(ax, centers)
    ax.set_xlabel("context length (tokens, log-spaced bins)")
    ax.set_ylabel("τ", rotation=0, labelpad=10)
    _legend(figure, [ax])
    return figure


def _per_position(steps, methods, palette) -> Figure | None:
    methods = [m for m in methods if (steps[steps.method == m].num_drafted > 0).any()]
    if not methods:
        return None
    k = int(steps.num_drafted.max())
    figure, axes = _panels(2, width=5.5, height=3.4)
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        table = stats.per_position(steps[steps.method == method], max_position=k)
        x = table.position.to_numpy() + (i - (len(methods) - 1) / 2) * width
        for ax, column in zip(axes, ("conditional", "marginal")):
            ax.bar(x, table[column], width=width, color=palette(method), label=method)
    for ax, column in zip(axes, ("conditional", "marginal")):
        ax.set_title(f"{column} acceptance")
        ax.set_xlabel("draft position j")
        ax.set_ylabel("rate")
        ax.set_ylim(0, 1)
        ax.set_xticks(range(1, k + 1))
    _legend(figure, axes)
    return figure


def _cost_vs_context(steps, methods, palette) -> Figure | None:
    edges = stats.context_bins(steps.context_len)
    centers = np.sqrt(np.maximum(edges[:-1], 1.0) * edges[1:])
    figure, axes = _panels(2, width=5.0, height=3.4)
    for method in methods:
        cell = steps[steps.method == method]
        if cell.empty:
            continue
        bins = stats.bin_index(cell.context_len, edges)
        means = cell.assign(bin=bins).groupby("bin")[["draft_s", "draft_state_bytes"]].mean()
        x = centers[means.index.to_numpy()]
        axes[0].plot(x, 1e3 * means.draft_s, marker="o", color=palette(method), label=method)
        state = means.draft_state_bytes.where(means.draft_state_bytes > 0)  # a log axis cannot show 0 B
        axes[1].plot(x, state, marker="o", color=palette(method), label=method)
    axes[0].set_ylabel("draft ms / step")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("draft-state memory (log scale)")
    axes[1].set_yscale("log", base=2)
    axes[1].yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=4))  # 1 KiB, 4 KiB, 16 KiB, …
    axes[1].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: human_bytes(v)))
    for ax in axes:
        _context_axis(ax, centers)
        ax.set_xlabel("context length (tokens)")
    _legend(figure, axes)
    return figure


def _speedup_per_task(summary, methods, tasks, palette) -> Figure | None:
    cells = summary[summary.method.isin(methods) & summary.speedup.notna()]
    if cells.empty:
        return None
    tasks = [t for t in tasks if t in set(cells.task)]
    methods = [m for m in methods if m in set(cells.method)]
    figure, (ax,) = _panels(1, width=max(5.0, 1.2 * len(tasks) * max(1, len(methods)) ** 0.5 + 2), height=3.6)
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        rows = cells[cells.method == method].set_index("task").reindex(tasks)
        x = np.arange(len(tasks)) + (i - (len(methods) - 1) / 2) * width
        error = np.vstack([rows.speedup - rows.speedup_ci_low, rows.speedup_ci_high - rows.speedup])
        ax.bar(x, rows.speedup, width=width, color=palette(method), label=method, yerr=np.nan_to_num(error),
               capsize=3, error_kw={"elinewidth": 1})
    ax.axhline(1.0, color="#555555", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("speedup over AR (×)")
    ax.set_ylim(bottom=0)
    _legend(figure, [ax])
    return figure
