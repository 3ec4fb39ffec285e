"""Reports: pure functions over the stored steps/turns tables and run.json files (they never touch a model).
τ, break-even τ, speedup, per-position acceptance, pairing and the degenerate-turn detector are defined once,
below the report (`evalsuite.metrics`, `evalsuite.degenerate`); the report's own statistics are:

- `load`: read run directories (`store.read_run`), merge them, refuse incomparable configurations
- `stats`: the trajectory bootstrap, context curves, costs, the per-cell summary
- `effects`: the context effect within trajectories (fixed-effects slopes, cluster bootstrap)
- `breakeven`: break-even τ* (`metrics.tau_break_even`) from the measured costs, in the τ/speedup table's bins
- `telemetry`: the DLite paper's table (memory, acceptance at 1/3/5, TTFT, ITL P50/P95, turn latency)
- `positions`: per-position acceptance and draft lengths per task and context tercile
- `decisions`: faster than `ar`, best and ties by a paired bootstrap, results with and without degenerate turns
- `verdict`: the verdict sentence per task, the caveat box, the drafters' training budget and held-out data
- `spans`: acceptance by span type and by copying (its section: paragraph, figure, tables)
- `policy`: the held-out speculation policy (which method per context bin and span kind)
- `tables`: every table, as a `formatting.Table`
- `figures`: matplotlib PNG + SVG
- `formatting`: the table model (`Cell`, `Table`, `Box`), its Markdown, LaTeX and HTML renderers, `human_bytes`
- `style`: the figures' look (rc settings, sizes, each method's `Palette`, the panel grid, the legend, `FigureFile`)
- `published`: published numbers beside ours
- `html`: the static index.html
- `build`: `write_report`, what `evalsuite report` calls

The modules are layered (pyproject.toml's import-linter contract): `build` → `html`, `tables`, `figures` and the
sections → the analyses → `formatting`, `style` → `stats`, `load`; none imports one above it.
"""
