"""The report's figures as a reader sees them, read back from their matplotlib artists: an interval only on a bin of
at least 5 turns and 3 trajectories (else a hollow point, no interval, and the legend says so), an interval even on a
single context bin, and the n behind every point and every bar."""

from __future__ import annotations

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer, ErrorbarContainer

from evalsuite import metrics
from evalsuite.report import figures, stats
from evalsuite.report.spans import COLUMNS as SPAN_COLUMNS
from evalsuite.report.spans import span_figure
from evalsuite.report.style import Palette, count
from tests.helpers import frames, steps_with_tau, turn_row

GROUPS = [("", ["m"])]
WHITE = matplotlib.colors.to_rgba("white")


def runs(plan: dict[str, list[int]], seed: int = 0):
    """(steps, turns): for each task, one trajectory per entry of `plan[task]` with that many turns; per-trajectory
    τ and speedup differ (so an interval has width), and contexts stay within 1.2× (one context bin per task)."""
    rng = np.random.default_rng(seed)
    turn_rows, step_rows = [], []
    for task, lengths in plan.items():
        for i, n_turns in enumerate(lengths):
            for t in range(n_turns):
                context = 1000 + 10 * i + 5 * t
                decode_s = float(0.5 + 0.3 * rng.random())
                turn_rows.append(turn_row("m", f"s{i}", t, context, task=task, decode_s=decode_s))
                turn_rows.append(turn_row("ar", f"s{i}", t, context, task=task))
                step_rows += steps_with_tau("m", f"s{i}", t, context, float(2.0 + rng.random()), n_steps=10,
                                            task=task)
    return frames(turn_rows, step_rows)


def hollow_points(ax) -> list[float]:
    """x of the points drawn hollow (white face) with data, i.e. shown without an interval."""
    return [float(x) for line in ax.lines if len(line.get_xdata()) and line.get_marker() not in ("none", "", None)
            and matplotlib.colors.to_rgba(line.get_markerfacecolor()) == WHITE for x in line.get_xdata()]


def errorbar_xs(ax) -> list[float]:
    xs = []
    for container in ax.containers:
        if isinstance(container, ErrorbarContainer):
            for segment in container.lines[2][0].get_segments():
                xs.append(float(segment[0][0]))
    return sorted(xs)


def legend_labels(figure) -> list[str]:
    return [t.get_text() for legend in figure.legends for t in legend.get_texts()]


def test_the_interval_rule_is_turns_and_trajectories_together():
    assert stats.interval_allowed(stats.MIN_INTERVAL_TURNS, stats.MIN_INTERVAL_TRAJECTORIES)
    assert not stats.interval_allowed(stats.MIN_INTERVAL_TURNS - 1, stats.MIN_INTERVAL_TRAJECTORIES)
    assert not stats.interval_allowed(100, stats.MIN_INTERVAL_TRAJECTORIES - 1)
    assert list(stats.interval_allowed([5, 4, 9], [3, 3, 2])) == [True, False, False]


def test_tau_vs_turn_draws_an_interval_only_on_five_turns_and_three_trajectories_and_prints_n():
    # 8 trajectories: turns 1-2 hold 8 turns each; turn 3 holds 4 turns of 4 trajectories (≥ 3 trajectories: the
    # old rule drew an interval there); turn 4 holds 2.
    steps, turns = runs({"swebench": [2, 2, 2, 2, 3, 3, 4, 4]})
    figure = figures._tau_vs_turn(steps, turns, GROUPS, ["swebench"], Palette(["m"]), seed=0, n_resamples=50)
    ax = figure.axes[0]
    assert errorbar_xs(ax) == [1.0, 2.0]
    assert sorted(hollow_points(ax)) == [3.0, 4.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1\nn=8", "2\nn=8", "3\nn=4", "4\nn=2"]
    assert stats.NO_INTERVAL_NOTE in legend_labels(figure)
    assert "fewer than 5 turns or 3 trajectories" in stats.NO_INTERVAL_NOTE
    legend_line = next(h for h, label in zip(figure.legends[0].legend_handles, legend_labels(figure)) if label == "m")
    assert legend_line.get_marker() == Palette(["m"]).line("m")["marker"]  # the method's marker, in the legend too


def test_tau_vs_turn_prints_the_range_of_n_where_methods_differ():
    steps, turns = runs({"swebench": [2] * 6})
    other = steps[(steps.sample_id != "s0") | (steps.turn == 0)].assign(method="k")  # k: 5 trajectories reach turn 2
    both = pd.concat([steps, other], ignore_index=True)
    figure = figures._tau_vs_turn(both, turns, [("", ["m", "k"])], ["swebench"], Palette(["m", "k"]), 0, 50)
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["1\nn=6", "2\nn=5–6"]


def context_panels(measure: str):
    # task "one": 6 one-turn trajectories in one context bin (an interval); "few": 4 (no interval: < 5 turns)
    steps, turns = runs({"one": [1] * 6, "few": [1] * 4})
    curves = stats.context_curves(steps, turns, seed=0, n_resamples=100)
    assert (curves.groupby("task").size() == 1).all()  # one bin per task: fill_between would draw nothing
    drafting = turns[turns.method == "m"]
    per_turn = metrics.per_turn(steps, drafting)
    figure = figures._context_figure(curves, per_turn, GROUPS, ["one", "few"], Palette(["m"]), measure, measure)
    return figure, curves


@pytest.mark.parametrize("measure", ["speedup", "tau"])
def test_a_single_context_bin_shows_its_interval_as_an_error_bar_or_a_hollow_point(measure):
    figure, curves = context_panels(measure)
    one, few = figure.axes
    row = curves[curves.task == "one"].iloc[0]
    assert errorbar_xs(one) == [pytest.approx(row.context_median)] and hollow_points(one) == []
    segment = next(c for c in one.containers if isinstance(c, ErrorbarContainer)).lines[2][0].get_segments()[0]
    assert sorted(segment[:, 1]) == pytest.approx([row[f"{measure}_lo"], row[f"{measure}_hi"]])
    assert errorbar_xs(few) == [] and len(hollow_points(few)) == 1
    assert not few.collections  # no band either
    assert stats.NO_INTERVAL_NOTE in legend_labels(figure)


def test_every_speedup_bar_carries_its_paired_turns():
    steps, turns = runs({"one": [1] * 6, "few": [2] * 4})
    summary = stats.summarize(steps, turns, seed=0, n_resamples=50)
    figure = figures._speedup_per_task(summary, ["m"], ["one", "few"], Palette(["m"]))
    ax = figure.axes[0]
    bars = [bar for container in ax.containers if isinstance(container, BarContainer) for bar in container]
    labels = {round(t.xy[0], 6): t for t in ax.texts}
    assert len(bars) == 2 and len(labels) == 2
    cells = summary[summary.method == "m"].set_index("task")
    for bar, task in zip(bars, ["one", "few"]):
        label = labels[round(bar.get_x() + bar.get_width() / 2, 6)]
        assert label.get_text() == f"n={count(cells.paired_turns[task])}"
        top = max(cells.speedup[task], np.nan_to_num(cells.speedup_ci_high[task]))
        assert label.xy[1] == pytest.approx(top)  # above the bar and its error bar, not across them
        assert ax.get_ylim()[1] >= 1.2 * top  # and with room above: nothing clipped
    assert [t.get_text() for t in ax.get_xticklabels()] == ["one\n(6 trajectories)", "few\n(4 trajectories)"]


def test_every_span_bar_carries_its_drafted_tokens_and_an_undrafted_span_has_no_bar():
    def row(method, span, n_tokens, drafted, accepted):
        return {"task": "swebench", "method": method, "span": span, "n_tokens": n_tokens,
                "share_of_output": np.nan, "drafted": drafted, "accepted": accepted,
                "acceptance_per_drafted": accepted / drafted if drafted else np.nan, "mean_accepted_per_step": 1.0}
    acceptance = pd.DataFrame([row("a", "prose", 900, 3000, 1500), row("a", "code", 40, 9, 9),
                               row("b", "prose", 900, 2500, 500), row("b", "code", 40, 0, 0),
                               row("a", "copied", 300, 1000, 900), row("a", "novel", 640, 2009, 609),
                               row("b", "copied", 300, 800, 400), row("b", "novel", 640, 1700, 100)],
                              columns=SPAN_COLUMNS)
    figure = span_figure(acceptance, ["swebench"], ["a", "b"])
    ax = figure.axes[0]
    bars = [container for container in ax.containers if isinstance(container, BarContainer)]
    assert [len(c) for c in bars] == [4, 3]  # b drafted nothing in code: no bar (not a bar at 0)
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == sorted(["n=3.0k", "n=9", "n=1.0k", "n=2.0k", "n=2.5k", "n=800", "n=1.7k"])
    assert ax.get_ylim()[1] > 1.0  # room for the n above a bar at 1


def test_a_legend_of_eight_entries_with_the_hollow_note_fits_the_figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from evalsuite.report.style import grid, legend

    figure, axes = grid(1, 5)
    names = ["dflash", "dlite", "dspark", "eagle3", "τ* (break-even)", "ngram", "suffix"]
    for name in names:
        axes[0, 0].plot([], [], marker="o", label=name)
    figure_ax = axes[-1, -1]
    figure_ax.plot([], [], marker="o", markerfacecolor="white", linestyle="none", label=stats.NO_INTERVAL_NOTE)
    legend(figure, axes)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    box = figure.legends[0].get_window_extent(canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= figure.bbox.x1 and box.y0 >= 0  # not cut at the figure's edge
