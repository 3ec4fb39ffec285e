"""`evalsuite report`: run directories in, tables (Markdown, LaTeX, CSV), figures (PNG, SVG) and index.html out.

A pure function of the stored tables and run.json files: it never loads a model or reruns anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd

from evalsuite.errors import UserError
from evalsuite.report import html as html_page
from evalsuite.report import published as published_numbers
from evalsuite.report import stats
from evalsuite.report.figures import write_figures
from evalsuite.report.load import Results, load_results
from evalsuite.report.tables import (Cell, Table, cost_table, long_agentic_table, position_table, results_table,
                                     tau_macro_table, tau_table, to_latex, to_markdown)

FORMATS = ("md", "latex", "csv", "html")
VERSION_KEYS = ("evalsuite", "torch", "transformers", "numpy", "pandas", "pyarrow")


@dataclass
class Report:
    out: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the report could not show, and merge decisions


def parse_formats(value: str) -> set[str]:
    names = {v.strip() for v in value.split(",") if v.strip()}
    if "all" in names:
        return set(FORMATS)
    unknown = names - set(FORMATS)
    if unknown or not names:
        raise UserError(f"--format {value}: choose md, latex, csv, html or all (comma-separated for several)")
    return names


def write_report(paths: list[Path], out: Path, formats: set[str] = frozenset(FORMATS), allow_mixed: bool = False,
                 seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES,
                 published_dir: Path = published_numbers.PUBLISHED_DIR) -> Report:
    results = load_results([Path(p) for p in paths], allow_mixed)
    out = Path(out)
    try:
        (out / "tables").mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create it ({err.strerror}); choose another directory") from err
    report = Report(out)
    summary = _in_report_order(stats.summarize(results.steps, results.turns, seed, n_resamples), results)
    header_tables = [runs_table(results), environment_table(results)]
    built = [tau_table(summary, results.methods, results.tasks),
             long_agentic_table(summary, results.methods, results.tasks),
             tau_macro_table(summary, results.methods, results.tasks),
             position_table(results.steps, results.methods),
             cost_table(results.steps, results.methods, results.tasks),
             published_numbers.comparison_table(results, summary, published_numbers.load_published(published_dir)),
             results_table(summary)]
    names = ["Table 1 (general tasks)", "Tables 2/3 (long-context and agentic tasks)", "τ turn macro",
             "per-position acceptance", "cost", "published comparison", "all results"]
    tables = [t for t in built if t is not None]
    report.notes += [f"{name}: nothing to show (no drafting method on such tasks in these runs)"
                     for name, t in zip(names, built) if t is None]
    figures, missing = write_figures(results, summary, out / "figures", seed, n_resamples)
    report.files += [f for fig in figures for f in (fig.png, fig.svg)]
    report.notes += missing
    report.notes += results.notes
    warnings = [f"MIXED CONFIGURATIONS (--allow-mixed): {line}" for line in results.mixed]

    for table in header_tables + tables:
        stem = out / "tables" / table.name
        if "md" in formats:
            report.files.append(_write(stem.with_suffix(".md"), to_markdown(table)))
        if "latex" in formats:
            report.files.append(_write(stem.with_suffix(".tex"), to_latex(table)))
        if "csv" in formats:
            stem.with_suffix(".csv").parent.mkdir(parents=True, exist_ok=True)
            table.csv.to_csv(stem.with_suffix(".csv"), index=False)
            report.files.append(stem.with_suffix(".csv"))
    title, subtitle = _titles(results)
    if "md" in formats:
        report.files.append(_write(out / "report.md", markdown_page(title, subtitle, warnings, report.notes,
                                                                     header_tables, tables, figures, out)))
    if "html" in formats:
        report.files.append(_write(out / "index.html", html_page.page(title, subtitle, warnings, report.notes,
                                                                       header_tables, tables, figures, out)))
    return report


def markdown_page(title, subtitle, warnings, notes, header_tables, tables, figures, base: Path) -> str:
    parts = [f"# {title}", "", subtitle, ""]
    parts += [f"> **Warning:** {w}\n" for w in warnings]
    parts += [f"> {n}\n" for n in notes]
    parts.append("## Runs: configuration and versions\n")
    parts += [to_markdown(t) for t in header_tables]
    parts.append("## Tables\n")
    parts += [to_markdown(t) for t in tables]
    parts.append("## Figures\n")
    for figure in figures:
        parts.append(f"### {figure.title}\n\n![{figure.title}]({figure.png.relative_to(base).as_posix()})\n\n"
                     f"{figure.caption} ([SVG]({figure.svg.relative_to(base).as_posix()}))\n")
    return "\n".join(parts)


def runs_table(results: Results) -> Table:
    """One column per run (runs have many fields and are few)."""
    records = []
    for run in results.runs:
        c = run.config
        records.append({
            "run": run.key, "path": str(run.path), "task": run.task_label, "methods": ",".join(c.get("methods", [])),
            "target": c.get("target_name") or c.get("target"), "target_sha256": c.get("target_sha256"),
            "chat_template_sha256": c.get("chat_template_sha256"), "temperature": c.get("temperature"),
            "top_p": c.get("top_p"), "top_k": c.get("top_k"), "k": c.get("k"),
            "max_new_tokens": c.get("max_new_tokens"), "samples": len(c.get("sample_ids", [])),
            "seed": c.get("seed"), "replay": c.get("replay"), "context_policy": c.get("context_policy"),
            "enable_thinking": c.get("enable_thinking"), "dtype": c.get("dtype"), "device": c.get("device"),
            "drafters": "; ".join(f"{m}: {d.get('checkpoint') or d.get('weights')}"
                                  for m, d in (c.get("drafters") or {}).items()
                                  if d.get("checkpoint") or d.get("weights")) or "none",
        })
    shortened = {"target_sha256", "chat_template_sha256"}
    fields = [k for k in records[0] if k != "run"]
    rows = [[Cell(name)] + [Cell(_text(r[name])[:12] if name in shortened else _text(r[name])) for r in records]
            for name in fields]
    notes = ["the full configuration of each run is its run.json; hashes are shortened to 12 hex digits here"]
    return Table("runs", "Run configurations", ["", *[r["run"] for r in records]], rows, notes,
                 pd.DataFrame(records))


def environment_table(results: Results) -> Table:
    records = []
    for run in results.runs:
        env = run.config.get("environment", {})
        versions = env.get("versions", {})
        records.append({"run": run.key, "git_commit": env.get("git_commit"), "started_at": env.get("started_at"),
                        "python": env.get("python"), **{k: versions.get(k) for k in VERSION_KEYS},
                        "device_name": env.get("device_name"), "platform": env.get("platform")})
    fields = [k for k in records[0] if k != "run"]
    rows = [[Cell(name)] + [Cell(_text(r[name])) for r in records] for name in fields]
    notes = [f"report generated by evalsuite {_own_version()} from these runs' stored tables only"]
    return Table("environment", "Versions and machines", ["", *[r["run"] for r in records]], rows, notes,
                 pd.DataFrame(records))


def _in_report_order(summary: pd.DataFrame, results: Results) -> pd.DataFrame:
    """Tasks in the order the runs were given, methods in `Results.methods` order."""
    task_rank = {t: i for i, t in enumerate(results.tasks)}
    method_rank = {m: i for i, m in enumerate(results.methods)}
    order = sorted(range(len(summary)), key=lambda i: (task_rank[summary.task.iloc[i]],
                                                       method_rank[summary.method.iloc[i]]))
    return summary.iloc[order].reset_index(drop=True)


def _titles(results: Results) -> tuple[str, str]:
    targets = sorted({str(r.config.get("target_name") or r.config.get("target")) for r in results.runs})
    title = "evalsuite report: " + ", ".join(results.tasks)
    subtitle = (f"Target: {'; '.join(targets)}. Methods: {', '.join(results.methods)}. "
                f"{len(results.runs)} run(s), {results.turns.groupby(['run', 'sample_id']).ngroups} trajectories.")
    return title, subtitle


def _text(value) -> str:
    return "–" if value is None else str(value)


def _own_version() -> str:
    try:
        return version("evalsuite")
    except PackageNotFoundError:
        return "(not installed)"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
