"""`evalsuite report`: run directories in, tables (Markdown, LaTeX, CSV), figures (PNG, SVG) and index.html out.

A pure function of the stored tables and run.json files: it never loads a model or reruns anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd

from evalsuite.errors import UserError
from evalsuite import metrics
from evalsuite.conventions import BASELINE
from evalsuite.report import (breakeven, checks, decisions, effects, hardware, noise, points, policy, positions,
                              regime, stats, telemetry, verdict)
from evalsuite.report import html as html_page
from evalsuite.report import published as published_numbers
from evalsuite.report.figures import write_figures
from evalsuite.report.load import Results, display_path, load_results, machines
from evalsuite.report.closed_loop import closed_loop_section
from evalsuite.report.formatting import Box, Cell, Table, to_latex, to_markdown
from evalsuite.report.spans import span_section
from evalsuite.report.tables import (baseline_table, break_even_table, context_effect_table,
                                     context_table, cost_context_table, cost_table, degenerate_turns_table,
                                     draft_length_table, headline_tables, position_table, position_tercile_table,
                                     repository_table, results_table, summary_table, tau_macro_table, telemetry_table,
                                     without_degenerate_table, design_table, slope_difference_table,
                                     end_to_end_table, policy_table, choice_table, identity_table, histogram_table,
                                     matrix_table, hardware_table, crossing_table, published_context_table)

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


@dataclass
class Section:
    id: str
    title: str
    items: list  # str (a paragraph), Table or FigureFile, in page order


def write_report(paths: list[Path], out: Path, formats: set[str] = frozenset(FORMATS), allow_mixed: bool = False,
                 seed: int = 0, n_resamples: int = stats.DEFAULT_RESAMPLES,
                 published_dir: Path = published_numbers.PUBLISHED_DIR, tasks: list[str] | None = None,
                 methods: list[str] | None = None, hardware_dirs: list[Path] | None = None,
                 analytic: bool = True, argv: list[str] | None = None) -> Report:
    """`hardware_dirs`: `evalsuite profile` directories whose costs price the measured acceptance in the "other
    hardware" table (besides the analytic H100 model unless `analytic` is False); `argv`: the command line, for
    command.txt."""
    out = Path(out)
    results = load_results([Path(p) for p in paths], allow_mixed, tasks, methods, base=out)
    try:
        (out / "tables").mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create it ({err.strerror}); choose another directory") from err
    report = Report(out)
    steps, turns = results.steps, results.turns
    limits = positions.run_limits(results.runs)
    summary = _in_report_order(stats.summarize(steps, turns, seed, n_resamples), results)
    curves = _in_report_order(stats.context_curves(steps, turns, seed, n_resamples), results)
    curves = breakeven.add_break_even(curves, breakeven.break_even_by_bin(steps, turns))
    costs = _in_report_order(stats.cost_curves(steps, turns), results)
    overall = _in_report_order(breakeven.break_even_overall(steps, turns, seed, n_resamples), results)
    effect = _in_report_order(effects.context_effect(steps, turns, seed, n_resamples), results)
    speed = decisions.speed_table(turns, seed, n_resamples)
    ranks = pd.concat([decisions.rank_methods(steps, turns, measure, seed, n_resamples)
                       for measure in ("tau", "speedup")], ignore_index=True)
    degenerate_table = _in_report_order(decisions.degenerate_comparison(steps, turns, seed, n_resamples), results)
    position_rates = _in_report_order(positions.position_table(steps, turns, limits), results)
    cards = verdict.drafter_cards(results.runs)
    figures, missing = write_figures(results, summary, curves, costs, out / "figures", seed, n_resamples,
                                     effect=effect, limits=limits)
    figure = {f.name: f for f in figures}
    report.files += [f for fig in figures for f in (fig.png, fig.svg)]
    report.notes += missing + results.notes

    design = effects.context_design(turns)
    drafting = [m for m in results.methods if m != BASELINE]
    differences = effects.slope_differences(steps, turns, seed, n_resamples,
                                            [(a, b) for i, a in enumerate(drafting) for b in drafting[i + 1:]])
    e2e = _in_report_order(telemetry.end_to_end(steps, turns, seed, n_resamples), results)
    from evalsuite.report.spans import load_run_spans

    policy_scores = policy.evaluate_policy(turns, seed, n_resamples, spans=load_run_spans(results))
    choices = policy.best_choices(turns, seed, n_resamples)
    noise_cells = noise.noise_table(turns, {r.key: int(r.config.get("repeats") or 1) for r in results.runs})
    ranks = noise.with_noise_ties(ranks, noise_cells)
    surfaces, surface_notes = _surfaces(results, hardware_dirs or [], analytic)
    projected = hardware.projections(steps, turns, surfaces, limits)
    histogram = checks.accepted_length_histogram(steps)
    verdict_lines = verdict.verdicts(speed, overall, effect, results.tasks, set(cards), degenerate_table, design,
                                     differences, e2e, noise_cells)
    headline = [Box("verdict", "Verdict", [f"**{r.task}: {r.label}.** {r.sentence}"
                                           for r in verdict_lines.itertuples()]),
                *headline_paragraphs(results, summary, speed, ranks, overall, noise_cells),
                *headline_tables(summary, results.methods, results.tasks, ranks, e2e),
                end_to_end_table(e2e), baseline_table(summary, turns, results.tasks)]
    sections = [
        Section("headline", "Headline", headline),
        Section("context", "Speedup and τ against context, within each task",
                [figure.get("speedup_vs_context"), figure.get("context_effect"), design_table(design),
                 context_effect_table(effect), slope_difference_table(differences), figure.get("tau_vs_context"),
                 context_table(curves), break_even_table(overall)]),
        Section("policy", "A speculation policy: what to run at which context",
                [policy_table(policy_scores), choice_table(choices)]),
        Section("hardware", "The cost model named: this answer on other hardware",
                [hardware_table(projected, surface_notes)]),
        Section("costs", "Cost against context: why the speedup moves",
                [figure.get("cost_vs_context"), cost_context_table(costs)]),
        Section("latency", "Telemetry: memory, latency and acceptance per method",
                [telemetry_table(_in_report_order(telemetry.telemetry(steps, turns, limits), results)),
                 noise_table_of(noise_cells)]),
        Section("checks", "Checks other harnesses print",
                [identity_table(_in_report_order(checks.identity_table(steps, turns, limits), results)),
                 histogram_table(histogram), matrix_table(checks.acceptance_matrix(steps), results.tasks,
                                                          results.methods)]),
        Section("degenerate", "Degenerate turns: results with and without them",
                [degenerate_turns_table(turns), without_degenerate_table(degenerate_table)]),
        Section("details", "Details",
                [summary_table(summary), figure.get("speedup_per_task"), figure.get("tau_vs_turn"),
                 figure.get("per_position"), position_table(position_rates), position_tercile_table(position_rates),
                 draft_length_table(_in_report_order(positions.draft_length_table(steps, turns, limits), results)),
                 tau_macro_table(summary, results.methods, results.tasks),
                 cost_table(steps, results.methods, results.tasks), repository_table(steps, turns),
                 published_numbers.comparison_table(results, summary, published_numbers.load_published(published_dir)),
                 results_table(summary)]),
        Section("configuration", "Configuration, data and provenance",
                [data_provenance_table(results), drafters_table(results, cards, out), provenance_table(results, out),
                 runs_table(results, out), environment_table(results)]),
    ]
    point_tasks = points.point_tasks(turns)
    if point_tasks:  # runs decoded at context points (the long-context study): right after the context section
        published_curves = points.load_curves()
        sections.insert(2, Section("long_context", "The long-context answer: context points", [
            Box("verdict", "Against context, within trajectories",
                points.findings(effect, differences, curves, point_tasks, published_curves)
                + [points.FINDINGS_CONVENTION]),
            crossing_table(points.crossings(curves, point_tasks)),
            published_context_table(points.published_beside(curves, published_curves, point_tasks))]))
    span_items, span_files, span_notes = span_section(results, out / "figures")
    if span_items:  # runs holding span labels (docs/spans.md): after the cost section
        sections.insert(3, Section("spans", "Acceptance by span type and by copying", span_items))
    report.files, report.notes = report.files + span_files, report.notes + span_notes
    closed_items = closed_loop_section(results, seed, n_resamples)
    if closed_items:  # --replay closed runs (BFCL-v3 live agent loops): before the details
        sections.insert(len(sections) - 2, Section("closed_loop", "Closed agent loop: live tool calls", closed_items))
    for section in sections:
        section.items = [item for item in section.items if item is not None]
    warnings = [f"MIXED CONFIGURATIONS (--allow-mixed): {line}" for line in results.mixed] + dirty_warnings(results)
    caveats = Box("caveat", "Caveats: how far these numbers carry",
                  verdict.caveat_box([r.config for r in results.runs], cards, _counts(results), results.tasks))

    for table in [item for section in sections for item in section.items if isinstance(item, Table)]:
        stem = out / "tables" / table.name
        if "md" in formats:
            report.files.append(_write(stem.with_suffix(".md"), to_markdown(table)))
        if "latex" in formats:
            report.files.append(_write(stem.with_suffix(".tex"), to_latex(table)))
        if "csv" in formats:
            stem.with_suffix(".csv").parent.mkdir(parents=True, exist_ok=True)
            table.csv.to_csv(stem.with_suffix(".csv"), index=False)
            report.files.append(stem.with_suffix(".csv"))
    if "csv" in formats:
        extra = {"end_to_end_turns": telemetry.end_to_end_turns(turns),
                 "accepted_length_by_task": checks.accepted_length_histogram(steps, by_task=True)}
        for name, frame in extra.items():
            frame.to_csv(out / "tables" / f"{name}.csv", index=False)
            report.files.append(out / "tables" / f"{name}.csv")
    report.files.append(_write(out / "command.txt", checks.command_text(results.runs, argv, out,
                                                                       lambda p: display_path(p, out))))
    title, subtitle = _titles(results)
    if "md" in formats:
        report.files.append(_write(out / "report.md", markdown_page(title, subtitle, warnings, report.notes,
                                                                     sections, out, caveats)))
    if "html" in formats:
        report.files.append(_write(out / "index.html", html_page.page(title, subtitle, warnings, report.notes,
                                                                       sections, out, caveats)))
    return report


def _counts(results: Results) -> dict[str, tuple[int, int]]:
    """{task: (trajectories, distinct decoded turns)} as analysed."""
    counts = {}
    for task in results.tasks:
        done = metrics.decoded(results.turns[results.turns.task == task])
        counts[task] = (int(done.groupby(["run", "sample_id"]).ngroups),
                        int(len(done.drop_duplicates(["run", "sample_id", "turn"]))))
    return counts


def markdown_page(title, subtitle, warnings, notes, sections: list[Section], base: Path,
                  caveats: Box | None = None) -> str:
    parts = [f"# {title}", "", subtitle, ""]
    parts += [f"> **Warning:** {w}\n" for w in warnings]
    if caveats is not None:
        parts.append(box_markdown(caveats))
    parts += [f"> {n}\n" for n in notes]
    for section in sections:
        parts.append(f"## {section.title}\n")
        for item in section.items:
            if isinstance(item, str):
                parts.append(item + "\n")
            elif isinstance(item, Box):
                parts.append(box_markdown(item))
            elif isinstance(item, Table):
                parts.append(to_markdown(item))
            else:
                parts.append(f"### {item.title}\n\n![{item.title}]({item.png.relative_to(base).as_posix()})\n\n"
                             f"{item.caption} ([SVG]({item.svg.relative_to(base).as_posix()}))\n")
    return "\n".join(parts)


def box_markdown(box: Box) -> str:
    return "\n".join([f"> **{box.title}**", ">"] + [f"> - {line}" for line in box.lines]) + "\n"


# ---- the headline paragraph ------------------------------------------------------------------------------------
def headline_paragraphs(results: Results, summary: pd.DataFrame, speed: pd.DataFrame, ranks: pd.DataFrame,
                        overall: pd.DataFrame, noise_cells: pd.DataFrame | None = None) -> list[str]:
    """A few generated sentences: the baseline's speed; per task the best method by the paired bootstrap and how
    many methods are faster than `ar` (interval clear of 1); each method's τ against its break-even; losslessness."""
    speeds = []
    for task in results.tasks:
        ms = summary[summary.task == task].ar_ms_per_token
        if len(ms) and pd.notna(ms.iloc[0]):
            speeds.append(f"{task} {ms.iloc[0]:.1f} ms/token ({1e3 / ms.iloc[0]:.1f} tokens/s)")
    first = (f"`{BASELINE}` (the target alone) decodes at " + "; ".join(speeds) + ".") if speeds else ""
    per_task = []
    for task in results.tasks:
        cells = speed[speed.task == task]
        if cells.empty:
            continue
        faster = int((cells.verdict == "faster than ar").sum())
        ranked = ranks[(ranks.task == task) & (ranks.measure == "speedup")]
        tie = noise.tie_clause(noise_cells, ranked, task) if noise_cells is not None else ""
        per_task.append(f"On {task}, {decisions.best_sentence(ranked, task)}{tie}; {faster} of {len(cells)} "
                        f"drafting methods are faster than `{BASELINE}` (decode-only speedup interval above 1).")
    break_even = " ".join(breakeven.break_even_sentence(overall, task) for task in results.tasks)
    drafting = summary[summary.method != BASELINE]
    greedy = drafting[drafting.compared_with_ar > 0]
    if len(greedy):
        differing = greedy[greedy.differs_from_ar > 0]
        lossless = (f"Losslessness at T = 0: {int(greedy.differs_from_ar.sum())} of {int(greedy.compared_with_ar.sum())} "
                    f"drafted turns differ from `{BASELINE}`'s output (it should be 0)")
        lossless += ("; " + ", ".join(f"{r.method} on {r.task}: {int(r.differs_from_ar)} of {int(r.compared_with_ar)}"
                                      for r in differing.itertuples()) + "." if len(differing) else ".")
    elif (summary.temperature == 0).any():
        lossless = f"Losslessness at T = 0 is not checked here: no `{BASELINE}` outputs to compare with."
    else:
        lossless = "Sampling (T > 0): outputs are not expected to match `ar` token for token, so none are compared."
    caveat = (f"Intervals are 95 % bootstrap intervals over whole trajectories, printed as [lo, hi]; below "
              f"{stats.MIN_INTERVAL_TRAJECTORIES} trajectories a cell has none and prints its n, and † marks cells "
              f"with fewer than {stats.MIN_TRAJECTORIES}. Best and ties are decided by a paired bootstrap of the "
              "ratio between two methods on the trajectories both ran, not by overlapping intervals.")
    noise_text = noise.noise_sentence(noise_cells) if noise_cells is not None else ""
    paragraphs = [" ".join(p for p in [first, *per_task] if p), break_even,
                  " ".join(p for p in (lossless, noise_text, caveat) if p)]
    return [p for p in paragraphs if p.strip()]


def dirty_warnings(results: Results) -> list[str]:
    dirty = {}
    for run in results.runs:
        commit = str((run.config.get("environment") or {}).get("git_commit") or "")
        if "dirty" in commit:
            dirty.setdefault(_short_commit(commit), []).append(run.key)
    return [f"run{'s' if len(keys) > 1 else ''} {', '.join(keys)} made from commit {commit}: the working tree had "
            "uncommitted changes, so the code that ran is not exactly that commit" for commit, keys in dirty.items()]


def data_provenance_table(results: Results) -> Table:
    """Per run: the samples (ids), the data they came from (hash), the replay mode and where the replies in the
    contexts came from, and the timing protocol (repeats, warm-up)."""
    records = []
    for run in results.runs:
        c = run.config
        done = metrics.decoded(results.turns[results.turns.run == run.key])
        single = len(done) > 0 and int(done.groupby(["method", "sample_id"]).turn.nunique().max()) == 1
        commit = _short_commit((c.get("environment") or {}).get("git_commit"))
        data = c.get("data_sha256") or (f"bundled task data of the code at {commit}" if not c.get("data_path")
                                        else "not recorded")
        records.append({"run": run.key, "task": run.task_label, "samples": len(c.get("sample_ids") or []),
                        "sample_ids": ", ".join(map(str, c.get("sample_ids") or [])) or "–",
                        "data": data, "data_source": c.get("task_source") or "–",
                        "replay": c.get("replay"), "replay_source": verdict.replay_source(c, single),
                        "timing_repeats": c.get("repeats", 1), "warmup": c.get("warmup"),
                        "temperature": c.get("temperature"), "seed": c.get("seed")})
    fields = [k for k in records[0] if k != "run"]
    rows = [[Cell(name)] + [Cell(_text(r[name])) for r in records] for name in fields]
    notes = ["data = run.json's data_sha256 (sha256 of a --data-path) or, for the bundled data, the commit it is "
             "versioned with", "replay source = run.json's replay_source where recorded, else the replay mode and "
             "the task's source", "timing repeats = decodes per turn from the same seed; the record kept is the median "
             "repeat (for an even count the lower middle one: of 2 repeats the faster, not a median of them)"]
    return Table("data_provenance", "Data and replay provenance", ["", *[r["run"] for r in records]], rows, notes,
                 pd.DataFrame(records))


def drafters_table(results: Results, cards: dict, base: Path) -> Table | None:
    """Per learned drafter: its checkpoint, its training budget and what its training data held out."""
    if not cards:
        return None
    tasks = [t.split(":")[0] for t in results.tasks]
    rows, records = [], []
    for method, facts in cards.items():
        checkpoint = next((d.get("checkpoint") for r in results.runs
                           for m, d in (r.config.get("drafters") or {}).items() if m == method and d.get("checkpoint")),
                          None)
        facts = facts or {}
        held = [t for t in tasks if t in (facts.get("heldout_tasks") or {})]
        record = {"method": method, "checkpoint": _shown(checkpoint, base), "steps": facts.get("steps"),
                  "training_minutes": facts.get("training_minutes"), "threads": facts.get("threads"),
                  "reply_tokens": facts.get("reply_tokens"), "warm_start": facts.get("warm_start"),
                  "data_sources": "; ".join(facts.get("data_sources") or []),
                  "heldout": (f"all samples of {', '.join(held)} held out ({facts['heldout_rule']})"
                              if facts.get("heldout_rule") and held else
                              "not stated" if not facts else f"held-out list lacks {', '.join(tasks)}")}
        records.append(record)
        rows.append([Cell(method), Cell(record["checkpoint"]), Cell(record["steps"]),
                     Cell(record["training_minutes"], digits=0), Cell(record["threads"]),
                     Cell(record["reply_tokens"]), Cell(_text(record["warm_start"])), Cell(record["data_sources"]),
                     Cell(record["heldout"])])
    notes = ["from each checkpoint's training_report.json (and MODEL_CARD.md) next to the weights; a warm start's "
             "own training is not counted in the budget", "– = the checkpoint has no training report here"]
    return Table("drafters", "Drafters: training budget and held-out data",
                 ["Method", "checkpoint", "steps", "minutes", "threads", "reply tokens", "warm start", "data",
                  "held out"], rows, notes, pd.DataFrame(records))


def provenance_table(results: Results, base: Path) -> Table:
    """Target and every drafter by name, path (never absolute) and full sha256."""
    records = {}
    for run in results.runs:
        c = run.config
        target = str(c.get("target") or "")
        records.setdefault(("target", c.get("target_name") or target), {
            "role": "target", "name": c.get("target_name") or target,
            "path": _shown(target, base), "sha256": c.get("target_sha256")})
        for method, info in (c.get("drafters") or {}).items():
            if not isinstance(info, dict) or not (info.get("checkpoint") or info.get("checkpoint_sha256")):
                continue
            checkpoint = info.get("checkpoint")
            records.setdefault((method, checkpoint), {
                "role": f"drafter ({method})", "name": Path(str(checkpoint)).name if checkpoint else method,
                "path": _shown(checkpoint, base),
                "sha256": info.get("checkpoint_sha256") or (c.get("drafter_sha256") or {}).get(method)})
    rows = [[Cell(r["role"]), Cell(str(r["name"])), Cell(r["path"]), Cell(_text(r["sha256"]))]
            for r in records.values()]
    notes = ["paths are relative to this report folder (./, ../) or to the repository root; a drafter's sha256 "
             "covers its safetensors files, the target's its weights file"]
    return Table("provenance", "Models: target and drafters", ["Role", "Name", "Path", "sha256"], rows, notes,
                 pd.DataFrame(list(records.values())))


def _shown(value, base: Path) -> str:
    """A path-like config value as the report prints it (never absolute); other values (a hub id, 'default') as
    they are."""
    if value is None or str(value) == "":
        return "–"
    text = str(value)
    if os.path.isabs(os.path.expanduser(text)) or Path(text).exists():
        return display_path(text, base)
    return text


def runs_table(results: Results, base: Path) -> Table:
    """One column per run (runs have many fields and are few)."""
    records = []
    for run in results.runs:
        c = run.config
        records.append({
            "run": run.key, "path": display_path(run.path, base), "task": run.task_label, "methods": ",".join(c.get("methods", [])),
            "target": c.get("target_name") or _shown(c.get("target"), base),
            "target_sha256": c.get("target_sha256"),
            "chat_template_sha256": c.get("chat_template_sha256"), "temperature": c.get("temperature"),
            "top_p": c.get("top_p"), "top_k": c.get("top_k"), "k": c.get("k"),
            "max_new_tokens": c.get("max_new_tokens"), "samples": len(c.get("sample_ids", [])),
            "seed": c.get("seed"), "replay": c.get("replay"), "context_policy": c.get("context_policy"),
            "enable_thinking": c.get("enable_thinking"), "dtype": c.get("dtype"), "device": c.get("device"),
            "weight_layout": c.get("weight_layout"), "kv_cache": c.get("kv_cache"), "compile": c.get("compile"),
            "drafters": "; ".join(f"{m}: {_shown(d.get('checkpoint') or d.get('weights'), base)}"
                                  for m, d in (c.get("drafters") or {}).items()
                                  if d.get("checkpoint") or d.get("weights")) or "none",
        })
    shortened = {"target_sha256", "chat_template_sha256"}
    fields = [k for k in records[0] if k != "run"]
    rows = [[Cell(name)] + [Cell(_text(r[name])[:12] if name in shortened else _text(r[name])) for r in records]
            for name in fields]
    notes = ["the full configuration of each run is its run.json; hashes are shortened to 12 hex digits here (in "
             "full in the models table)", "paths are relative to this report folder (./, ../) or to the repository"]
    return Table("runs", "Run configurations", ["", *[r["run"] for r in records]], rows, notes,
                 pd.DataFrame(records))


def environment_table(results: Results) -> Table:
    records, mixed = [], []
    for run in results.runs:
        env = run.config.get("environment", {})
        decoded_on = machines(run.config)
        if len(decoded_on) > 1:
            mixed.append(run.key)
        versions = env.get("versions", {})
        records.append({"run": run.key, "git_commit": env.get("git_commit"), "started_at": env.get("started_at"),
                        "python": env.get("python"), **{k: versions.get(k) for k in VERSION_KEYS},
                        "device_name": env.get("device_name"), "platform": env.get("platform"),
                        "workers": _workers(results.turns[results.turns.run == run.key]),
                        "machines": "; ".join(decoded_on) or None})
    fields = [k for k in records[0] if k != "run"]
    rows = [[Cell(name)] + [Cell(_text(r[name])) for r in records] for name in fields]
    notes = [f"report generated by evalsuite {_own_version()} from these runs' stored tables only",
             "machines: the device of the run's first invocation and of each --resume (run.json `resumes`)"]
    if mixed:
        notes.append(f"run(s) {', '.join(mixed)} were decoded on more than one machine: each turn is still paired "
                     "with `ar` on one machine (the worker of its row), but pooled speedups and context slopes "
                     "mix machines; compare the speedups of turns decoded on one (turns.parquet worker_device)")
    return Table("environment", "Versions and machines", ["", *[r["run"] for r in records]], rows, notes,
                 pd.DataFrame(records))


def _in_report_order(summary: pd.DataFrame, results: Results) -> pd.DataFrame:
    """Tasks in the order the runs were given, methods in `Results.methods` order (then by context, if binned; rows
    that tie, e.g. the positions or terciles of one method, keep their order)."""
    task_rank = {t: i for i, t in enumerate(results.tasks)}
    method_rank = {m: i for i, m in enumerate(results.methods)}
    column = next((c for c in ("context_lo", "step_context_lo") if c in summary.columns), None)
    context = summary[column] if column else pd.Series(0, index=summary.index)
    order = sorted(range(len(summary)), key=lambda i: (task_rank.get(summary.task.iloc[i], len(task_rank)),
                                                       method_rank.get(summary.method.iloc[i], len(method_rank)),
                                                       context.iloc[i]))  # sorted() is stable: ties keep order
    return summary.iloc[order].reset_index(drop=True)


def _titles(results: Results) -> tuple[str, str]:
    targets = sorted({f"{r.config.get('target_name') or r.config.get('target')} (sha256 "
                      f"{str(r.config.get('target_sha256'))[:12]}…)" for r in results.runs})
    commits = sorted({_short_commit((r.config.get("environment") or {}).get("git_commit")) for r in results.runs})
    title = "evalsuite report: " + ", ".join(results.tasks)
    subtitle = (f"Target: {'; '.join(targets)}. Methods: {', '.join(results.methods)}. "
                f"{len(results.runs)} run(s), {results.turns.groupby(['run', 'sample_id']).ngroups} trajectories. "
                f"Code: {', '.join(commits)}" + (" (UNCOMMITTED CHANGES: +dirty)" if any("dirty" in c for c in commits)
                                                  else "") + ".")
    return title, subtitle


def _workers(turns: pd.DataFrame) -> str | None:
    """The hosts and devices that decoded a run's turns (recorded per turn by scale-out runs), or None."""
    if "worker_host" not in turns.columns:
        return None
    return ", ".join(sorted(set(effects.machine_keys(turns)) - {""})) or None


def _short_commit(commit) -> str:
    text = str(commit)
    head, dirty, _ = text.partition("+")
    return head[:12] + (f"+{_}" if dirty else "")


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


def noise_table_of(cells: pd.DataFrame) -> Table | None:
    if cells.empty:
        return None
    unmeasured = cells.groupby("task", sort=False).n_turns_measured.transform("sum") == 0
    if unmeasured.any():  # a task with no measured turn: one row for all its methods
        collapsed = cells[unmeasured].groupby(["task", "repeats", "status"], sort=False).agg(
            n_turns=("n_turns", "max"), n_turns_measured=("n_turns_measured", "sum")).reset_index()
        collapsed = collapsed.assign(method="every method", median_cv=float("nan"), p90_cv=float("nan"))
        cells = pd.concat([collapsed[cells.columns], cells[~unmeasured]], ignore_index=True)
    rows = [[Cell(r.task), Cell(r.method), Cell(r.repeats), Cell(f"{int(r.n_turns_measured)} / {int(r.n_turns)}"),
             Cell(f"{100 * r.median_cv:.1f} %" if pd.notna(r.median_cv) else "–"),
             Cell(f"{100 * r.p90_cv:.1f} %" if pd.notna(r.p90_cv) else "–"), Cell(r.status)]
            for r in cells.itertuples(index=False)]
    return Table("timing_noise", "Timing noise per task and method (spread over the --repeats decodes)",
                 ["Task", "Method", "repeats", "turns measured", "median CV", "P90 CV", "status"], rows,
                 [noise.NOISE_CONVENTION], cells)


def _surfaces(results: Results, directories: list[Path], analytic: bool):
    """The cost surfaces of the "other hardware" table and the notes under it."""
    surfaces, notes = [], []
    runs = regime.RunSteps(results.steps, results.turns)
    devices = {str((r.config.get("environment") or {}).get("device_name")) for r in results.runs}
    targets = {str(r.config.get("target_name")) for r in results.runs}
    for directory in directories:
        cost = regime.load_cost(directory)
        same = str((cost.run.get("environment") or {}).get("device_name")) in devices and len(devices) == 1 and \
            str(cost.run.get("target")) in targets
        surface = hardware.from_profile(cost, runs, same, name=f"profile {display_path(directory)} "
                                                              f"({(cost.run.get('environment') or {}).get('device_name')})")
        surfaces.append(surface)
        notes.append(f"{surface.name}: measured by `evalsuite profile` (random weights, costs only), "
                     + ("the runs' own machine and target: validated at batch 1 ("
                        + regime.validation_summary(surface.validation) + ")" if same else
                        "another machine or target than the runs': not validated here"))
    if analytic:
        surface = hardware.analytic_h100_8b(hardware.host_draft_ms(results.steps))
        surfaces.append(surface)
        notes += surface.notes
    return surfaces, notes
