"""One static page, `index.html`: the headline first (a generated paragraph, Table 1, the baseline's speed), then the
context curves and their cost, the details, and the configuration and environment at the end. Images are referenced
relatively, so the report folder can be moved or served as it is."""

from __future__ import annotations

import html
from pathlib import Path

from evalsuite.report.formatting import Box, Table, inline_code, to_html
from evalsuite.report.style import FigureFile

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; color: #1d2733; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.25rem; margin-top: 2.2rem; border-bottom: 1px solid #d6dbe1; padding-bottom: .2rem; }
h3 { font-size: 1.05rem; margin: 1.4rem 0 .4rem; }
.subtitle { color: #56606b; margin-top: 0; }
.warning { background: #fff4e5; border-left: 4px solid #e8890c; padding: .5rem .8rem; margin: .6rem 0; }
.note { background: #eef4fb; border-left: 4px solid #4a7fc1; padding: .5rem .8rem; margin: .6rem 0; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: .88rem; margin: .3rem 0; }
th, td { padding: .25rem .6rem; white-space: nowrap; }
thead tr:first-child th { border-top: 2px solid #1d2733; }
thead tr:last-child th { border-bottom: 1px solid #1d2733; }
tbody tr:last-child td { border-bottom: 2px solid #1d2733; }
th.group { border-bottom: 1px solid #9aa4ae; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.label { text-align: left; white-space: normal; max-width: 30rem; }
tbody tr:nth-child(even) { background: #f6f8fa; }
span.ci { font-size: .78em; color: #56606b; }
ul.notes { font-size: .8rem; color: #56606b; margin: .3rem 0 0; padding-left: 1.2rem; }
figure { margin: 1rem 0 2rem; }
figure img { width: 100%; height: auto; border: 1px solid #e5e8eb; }  /* one width: the same font size in all */
p.lead { font-size: 1rem; max-width: 62rem; }
code { font-size: .9em; background: #f2f4f6; padding: 0 .2em; border-radius: 3px; }
figcaption { font-size: .85rem; color: #56606b; }
nav a { margin-right: .8rem; }
.box { border: 1px solid #c9d3de; border-radius: 4px; padding: .4rem 1rem .6rem; margin: .8rem 0; max-width: 72rem; }
.box h3 { margin: .3rem 0 .3rem; }
.box ul { margin: .2rem 0; padding-left: 1.2rem; }
.box li { margin: .25rem 0; }
.caveat { background: #fffaf0; border-left: 5px solid #d08a1a; }
.verdict { background: #f2f8f2; border-left: 5px solid #3f8a4a; }
"""


def page(title: str, subtitle: str, warnings: list[str], notes: list[str], sections, base: Path,
         caveats: Box | None = None) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
             f"<h1>{html.escape(title)}</h1>", f'<p class="subtitle">{html.escape(subtitle)}</p>']
    parts.append("<nav>" + "".join(f'<a href="#{s.id}">{html.escape(s.title)}</a>' for s in sections) + "</nav>")
    parts += [f'<div class="warning">{html.escape(w)}</div>' for w in warnings]
    if caveats is not None:
        parts.append(box_html(caveats))
    parts += [f'<div class="note">{html.escape(n)}</div>' for n in notes]
    for section in sections:
        parts.append(f'<h2 id="{section.id}">{html.escape(section.title)}</h2>')
        for item in section.items:
            if isinstance(item, str):
                parts.append(f'<p class="lead">{inline_code(item)}</p>')
            elif isinstance(item, Box):
                parts.append(box_html(item))
            elif isinstance(item, Table):
                parts.append(f'<div class="scroll">{to_html(item)}</div>')
            else:
                parts.append(_figure(item, base))
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def _figure(figure: FigureFile, base: Path) -> str:
    png = figure.png.relative_to(base).as_posix()
    svg = figure.svg.relative_to(base).as_posix()
    return (f'<figure id="fig-{figure.name}"><h3>{html.escape(figure.title)}</h3>'
            f'<img src="{html.escape(png)}" alt="{html.escape(figure.title)}">'
            f'<figcaption>{inline_code(figure.caption)} <a href="{html.escape(svg)}">SVG</a></figcaption></figure>')


def box_html(box: Box) -> str:
    """A framed list; `**bold**` at the start of a line is kept as bold, `code` as code."""
    items = []
    for line in box.lines:
        if line.startswith("**") and "**" in line[2:]:
            head, rest = line[2:].split("**", 1)
            items.append(f"<li><strong>{inline_code(head)}</strong>{inline_code(rest)}</li>")
        else:
            items.append(f"<li>{inline_code(line)}</li>")
    return (f'<div class="box {html.escape(box.kind)}"><h3>{html.escape(box.title)}</h3><ul>' + "".join(items)
            + "</ul></div>")
