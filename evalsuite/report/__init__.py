"""Reports: pure functions over the stored steps/turns tables and run.json files (they never touch a model).
τ, speedup, per-position acceptance, pairing and the degenerate-turn detector are defined once, below the report
(`evalsuite.metrics`, `evalsuite.degenerate`); the report's own statistics are:

- `load`: read run directories (`store.read_run`), merge them, refuse incomparable configurations
- `stats`: the trajectory bootstrap, context curves, costs, the per-cell summary
- `effects`: the context effect within trajectories (fixed-effects slopes, cluster bootstrap)
- `breakeven`: break-even τ* from the measured costs
- `telemetry`: the DLite paper's table (memory, acceptance at 1/3/5, TTFT, ITL P50/P95, turn latency)
- `positions`: per-position acceptance and draft lengths per task and context tercile
- `decisions`: faster than `ar`, best and ties by a paired bootstrap, results with and without degenerate turns
- `verdict`: the verdict sentence per task, the caveat box, the drafters' training budget and held-out data
- `tables`: every table in Markdown, LaTeX, HTML and CSV
- `figures`: matplotlib PNG + SVG
- `published`: published numbers beside ours
- `html`: the static index.html
- `build`: `write_report`, what `evalsuite report` calls
"""
