"""Reports: pure functions over the stored steps/turns tables and run.json files (they never touch a model).

- `load`: read run directories, merge them, refuse incomparable configurations
- `stats`: τ, per-position acceptance, speedup, costs, trajectory bootstrap (the one definition of each)
- `tables`: Table 1 / Tables 2-3 / per-position / cost tables in Markdown, LaTeX, HTML and CSV
- `figures`: matplotlib PNG + SVG
- `published`: published numbers beside ours
- `html`: the static index.html
- `build`: `write_report`, what `evalsuite report` calls
"""
