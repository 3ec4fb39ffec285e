"""The report's figure style, shared by every figure builder (`figures`, `spans`): matplotlib's rc settings, the
width, dpi and row height every figure uses, each method's colour, marker and dashes (`Palette`), the panel grid,
the legend under a figure, the short count printed on a bar or under a point (`count`), and `FigureFile` (a
written figure, as the page lists it).

Matplotlib's Agg canvas only, without pyplot's global state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

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


def grid(rows: int, columns: int, height: float = ROW_HEIGHT, sharey: str | bool = False):
    """A figure FIG_WIDTH wide with rows × columns panels (always a 2-d array of axes)."""
    figure = Figure(figsize=(FIG_WIDTH, height * rows + 0.5), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False, sharey=sharey)
    return figure, axes


def legend(figure: Figure, axes) -> None:
    """One legend under the figure for all its panels (each label once; labels starting with _ left out), in rows
    of at most 7 entries made as even as they go (8 entries: two rows of 4, so a long entry such as the hollow-marker
    note does not push a row past the figure's width)."""
    handles, labels = {}, []
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles and not label.startswith("_"):
                handles[label] = handle
                labels.append(label)
    if handles:
        rows = -(-len(labels) // 7)
        figure.legend([handles[label] for label in labels], labels, loc="outside lower center",
                      ncols=-(-len(labels) // rows), frameon=False)


def count(n: int) -> str:
    """A count printed on a bar or under a point, short: 3, 412, 3,100 → 3.1k (a rate over 3 steps must not look
    like one over 3,000, and neither label may crowd its neighbours)."""
    n = int(n)
    return f"{n:,}" if n < 1000 else f"{n / 1000:.1f}k"
