"""Run configuration and its one validation, and the environment facts every run writes to run.json.

No torch at import: the CLI validates a whole configuration (names, values, method settings, the engine and
scale-out options) in milliseconds, before any model is loaded.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from evalsuite.catalog import ENGINES, engine_refusal, engine_spec, method_spec, suggest
from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError

REPLAY_MODES = ("auto", "logged", "free", "closed")  # closed: the task's environment runs the calls (replay/closed.py)
# --tool-format of the closed loop: the template's own tools and tool calls | BFCL's prompting mode (None = native
# where the target's chat template takes `tools`, else prompt; the runner records the resolved one)
TOOL_FORMATS = ("native", "prompt")
CONTEXT_POLICIES = ("stop", "truncate-left")
# "fused": evalsuite.target.decoder's forward, few-row products on MKL; "fused+onednn": the same forward, products of
# 1 … 32 rows on oneDNN's reordered weights; "fused+panel": the same on evalsuite's own panel kernel
# (evalsuite.target.cpu_kernels) (`FusedDecoder.prepare_blocks`); auto measures which is fastest here
WEIGHT_LAYOUTS = ("auto", "fused", "fused+onednn", "fused+panel", "row-major", "column-major", "column-major+onednn")
PRODUCTS_OF_LAYOUT = {"fused": "mkl", "fused+onednn": "onednn", "fused+panel": "panel"}  # the fused decoder's kernels
CACHE_KINDS = ("static", "dynamic")
CUDA_GRAPHS = ("auto", "on", "off")
# How the CUDA-graph forwards attend over their span (evalsuite.target.captured_attention; --captured-attention auto
# resolves to the fastest exact one that runs on the device)
CAPTURED_ATTENTIONS = {
    "masked-sdpa": "SDPA under a boolean mask of the live columns (any device and dtype; reads the whole span)",
    "flash-length": "flash attention over the live keys (CUDA, float16/bfloat16)",
    "split-k": "the split-K Triton kernel over the live keys (CUDA with triton, any dtype)",
    "flash+split": "flash-length for one-token decodes, split-k for verify blocks (CUDA with triton, "
                   "float16/bfloat16)",
}
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def compile_conflict(weight_layout: str, cuda_graphs: str) -> str | None:
    """Why `--compile` cannot run with these settings (a one-line error), or None."""
    if weight_layout.endswith(("+onednn", "+panel")):
        return (f"--compile with --weight-layout {weight_layout}: its prepared weights are opaque to torch.compile; "
                "use --weight-layout auto, fused or column-major")
    if cuda_graphs == "on":
        return "--compile with --cuda-graphs on: choose one way to capture the forwards"
    return None


@dataclass
class RunConfig:
    methods: list[str]
    task: str
    target: str = "default"
    drafters: dict[str, str] = field(default_factory=dict)  # learned method → checkpoint dir, HF id or "random"
    device: str = "cpu"
    dtype: str | None = None
    weight_layout: str = "auto"  # the target's Linear weight storage (TargetModel.load); resolved in run.json
    kv_cache: str = "static"  # the target's KV cache: static (evalsuite.target.kv_cache) | dynamic (transformers')
    compile: bool = False  # torch.compile: the fused decoder's decodes, or the HF decoder's forwards
    cuda_graphs: str = "auto"  # decode and verify forwards replayed from CUDA graphs: auto (on CUDA) | on | off
    captured_attention: str = "auto"  # how those forwards attend: auto | CAPTURED_ATTENTIONS; resolved in run.json
    k: int = 7
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    limit: int | None = None
    seed: int = 0
    out: str | None = None
    resume: bool = False
    replay: str = "auto"
    tool_format: str | None = None  # --replay closed: native | prompt (None: auto, resolved by the runner)
    context_policy: str = "stop"
    max_turns: int | None = None
    enable_thinking: bool = False
    data_path: str | None = None
    subset: str | None = None
    format: str | None = None  # --format: the trajectory format of --data-path (swebench); None = detected
    warmup: bool = True
    repeats: int = 1  # each turn is decoded this many times from the same seed; the median is kept
    method_options: dict[str, dict] = field(default_factory=dict)  # method → {setting: value} (evalsuite.catalog)
    engine: str = "hf"  # hf (ours) | vllm (evalsuite/engines/vllm_engine.py)
    sample_ids: list[str] | None = None  # exact samples to run (instead of a seeded --limit subset)
    threads: int | str | None = "auto"  # torch intra-op threads: "auto" = the cores other processes leave free
    # (evalsuite.contention); the count used is recorded and is a drift field
    context_points: list[int] | None = None  # decode only the first turn whose context reaches each (tokens)
    workers: int = 1  # Ray worker actors (1 = this process, no Ray)
    ray_address: str | None = None  # join this Ray cluster (implies the Ray path)
    gpus_per_worker: float | None = None  # None: 1 with --device cuda, 0 on cpu
    threads_per_worker: int | None = None  # None: the node's cores / workers

    def validate(self) -> None:
        """Every check of the configuration, each a one-line UserError naming the option; method settings are
        converted to their types (evalsuite.catalog)."""
        self._check_numbers()
        self._check_choices()
        self._check_methods()
        self._check_samples()
        self._check_points()
        self._check_engine()
        self._check_data_format()
        self._check_closed_loop()

    def _check_numbers(self) -> None:
        if not 1 <= self.k <= 64:
            raise UserError(f"--k {self.k}: the draft length must be between 1 and 64")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise UserError(f"--temperature {self.temperature}: must be a finite number >= 0")
        if self.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens {self.max_new_tokens}: must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise UserError(f"--limit {self.limit}: must be >= 1")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p {self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise UserError(f"--top-k {self.top_k}: must be >= 0 (0 turns the filter off)")
        if self.max_turns is not None and self.max_turns < 1:
            raise UserError(f"--max-turns {self.max_turns}: must be >= 1")
        if not 1 <= self.repeats <= 100:
            raise UserError(f"--repeats {self.repeats}: must be between 1 and 100")
        if self.threads not in (None, "auto"):
            try:
                self.threads = int(self.threads)
            except (TypeError, ValueError):
                raise UserError(f"--threads {self.threads}: a number of threads, or auto") from None
            if self.threads < 1:
                raise UserError(f"--threads {self.threads}: must be >= 1")
        if self.workers < 1:
            raise UserError(f"--workers {self.workers}: must be >= 1")
        if self.gpus_per_worker is not None and self.gpus_per_worker < 0:
            raise UserError(f"--gpus-per-worker {self.gpus_per_worker}: must be >= 0")
        if self.threads_per_worker is not None and self.threads_per_worker < 1:
            raise UserError(f"--threads-per-worker {self.threads_per_worker}: must be >= 1")

    def _check_choices(self) -> None:
        for option, value, choices in (("--replay", self.replay, REPLAY_MODES),
                                       ("--context-policy", self.context_policy, CONTEXT_POLICIES),
                                       ("--weight-layout", self.weight_layout, WEIGHT_LAYOUTS),
                                       ("--kv-cache", self.kv_cache, CACHE_KINDS)):
            if value not in choices:
                raise UserError(f"{option} {value}: choose from {', '.join(choices)}{suggest(value, choices)}")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise UserError(f"--device {self.device}: use cpu or cuda[:N]")
        if self.dtype is not None and self.dtype != "auto" and self.dtype not in DTYPES:
            raise UserError(f"--dtype {self.dtype}: expected one of float32, bfloat16, float16")
        engine = engine_spec(self.engine)
        if self.device == "cpu" and engine.cpu_dtypes and \
                DTYPES.get(self.dtype or "float32", "float32") not in engine.cpu_dtypes:
            raise UserError(f"--dtype {self.dtype}: only {', '.join(engine.cpu_dtypes)} is supported on CPU")
        conflict = compile_conflict(self.weight_layout, self.cuda_graphs) if self.compile else None
        if conflict:
            raise UserError(conflict)
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise UserError(f"--cuda-graphs {self.cuda_graphs}: choose from {', '.join(CUDA_GRAPHS)}")
        if self.captured_attention not in ("auto", *CAPTURED_ATTENTIONS):
            raise UserError(f"--captured-attention {self.captured_attention}: choose from auto, "
                            f"{', '.join(CAPTURED_ATTENTIONS)}")
        if self.cuda_graphs == "on" and not self.device.startswith("cuda"):
            raise UserError(f"--cuda-graphs on with --device {self.device}: CUDA graphs need --device cuda")
        if self.weight_layout == "fused" and self.kv_cache == "dynamic":
            raise UserError("--weight-layout fused runs on the static KV cache; drop --kv-cache dynamic")
        if self.gpus_per_worker and not self.device.startswith("cuda"):
            raise UserError(f"--gpus-per-worker {self.gpus_per_worker} with --device {self.device}: pass --device "
                            "cuda or --gpus-per-worker 0")
        from evalsuite.tasks.base import get_task  # a few ms: the adapters import no model code

        get_task(self.task)

    def _check_methods(self) -> None:
        if not self.methods:
            raise UserError("--method: name at least one method")
        specs = {name: method_spec(name) for name in self.methods}
        repeated = sorted({m for m in self.methods if self.methods.count(m) > 1})
        if repeated:
            raise UserError(f"--method: {', '.join(repeated)} given more than once")
        # a variant (label NAME:KEY=VALUE) takes its base's --drafter and --method-option unless given its own, so
        # those may name the base even when only its variants run
        named = set(self.methods) | {spec.base for spec in specs.values() if spec.base}
        for name, path in self.drafters.items():
            spec = method_spec(name)
            if name not in named:
                raise UserError(f"--drafter {name}={path}: method {name} is not in --method {','.join(self.methods)}; "
                                "add it there or drop this --drafter")
            if not spec.needs_checkpoint:
                raise UserError(f"--drafter {name}={path}: method {name} takes no checkpoint")
        for name in self.method_options:
            if name not in named:
                raise UserError(f"--method-option {name}.…: method {name} is not in --method {','.join(self.methods)}")
        drafters, parsed = dict(self.drafters), {}
        for name, spec in specs.items():
            raw = dict(self.method_options.get(name, {}))
            if spec.base:
                inherited = {k: v for k, v in self.method_options.get(spec.base, {}).items() if k not in spec.presets}
                raw = {**inherited, **raw}
                if name not in drafters and spec.base in drafters:
                    drafters[name] = drafters[spec.base]
            options = spec.parse_options(raw)
            if options:
                parsed[name] = options
        self.drafters = {m: path for m, path in drafters.items() if m in self.methods}
        self.method_options = parsed
        if self.repeats > 1:
            learning = [m for m in self.methods if not specs[m].repeatable]
            if learning:
                raise UserError(f"--repeats {self.repeats}: method {learning[0]} learns from every reply it sees, so "
                                "a repeated turn would not repeat the same work; use --repeats 1")

    def _check_points(self) -> None:
        if self.context_points is None:
            return
        if not self.context_points or any(not isinstance(p, int) or p < 1 for p in self.context_points):
            raise UserError(f"--context-points {self.context_points}: positive token counts, e.g. 2k,4k,8k")
        if sorted(set(self.context_points)) != list(self.context_points):
            raise UserError(f"--context-points {','.join(map(str, self.context_points))}: give them increasing, "
                            "each once")
        if self.replay in ("free", "closed"):
            raise UserError(f"--context-points with --replay {self.replay}: the turns between points are not decoded, so the "
                            "model writes no reply to continue from; use logged replay")

    def _check_samples(self) -> None:
        if self.sample_ids is not None:
            if not self.sample_ids:
                raise UserError("--sample-ids: name at least one sample id")
            if self.limit is not None:
                raise UserError("--sample-ids and --limit: give one of them (the ids already fix the samples)")
            repeated = sorted({i for i in self.sample_ids if self.sample_ids.count(i) > 1})
            if repeated:
                raise UserError(f"--sample-ids: {', '.join(repeated)} given more than once")

    def _check_engine(self) -> None:
        """What the engine declares it cannot do (evalsuite.catalog.EngineSpec), each a one-line error."""
        engine = engine_spec(self.engine)
        if not engine.scale_out and self.uses_ray:
            others = ", ".join(name for name, other in ENGINES.items() if other.scale_out)
            raise UserError(f"--engine {engine.name} runs its engines from this process; --workers/--ray-address are "
                            f"for --engine {others}")
        if not engine.repeats and self.repeats > 1:
            raise UserError(f"--repeats {self.repeats}: --engine {engine.name} decodes each turn once; use --repeats 1")
        for name in self.methods:
            refusal = engine_refusal(engine, method_spec(name), self.method_options.get(name, {}))
            if refusal:
                raise UserError(refusal)

    def _check_data_format(self) -> None:
        if self.format in (None, "auto"):
            self.format = None
            return
        from evalsuite.tasks._trajectory_formats import check_format_name
        from evalsuite.tasks.base import get_task

        if not get_task(self.task).formats:
            raise UserError(f"--format {self.format}: task {self.task} reads one format; --format is for --task "
                            "swebench trajectories")
        check_format_name(self.format)

    def _check_closed_loop(self) -> None:
        if self.tool_format in ("", "auto"):
            self.tool_format = None
        if self.tool_format is not None and self.tool_format not in TOOL_FORMATS:
            raise UserError(f"--tool-format {self.tool_format}: choose from auto, {', '.join(TOOL_FORMATS)}"
                            f"{suggest(self.tool_format, TOOL_FORMATS)}")
        if self.replay != "closed":
            if self.tool_format is not None:
                raise UserError(f"--tool-format {self.tool_format}: it sets how the closed loop asks for tool calls; "
                                "use it with --replay closed")
            return
        from evalsuite.tasks.environment import ENVIRONMENTS, task_environment

        environment = task_environment(self.task)
        if environment is None:
            tasks = " or ".join(f"--task {name}" for name in sorted(ENVIRONMENTS))
            raise UserError(f"--replay closed runs a task's executed tools: use {tasks} (not {self.task})")
        environment.require()

    @property
    def uses_ray(self) -> bool:
        return self.workers > 1 or bool(self.ray_address)

    @property
    def recorded_methods(self) -> list[str]:
        """The methods decoded, the `ar` baseline first (it runs for pairing even when not asked for)."""
        return [BASELINE] + [m for m in self.methods if m != BASELINE]

    def as_dict(self) -> dict:
        return asdict(self)


# Fields of run.json whose change makes two runs' numbers incomparable; --resume refuses to mix them and
# `evalsuite report` refuses to merge them (some only among runs of one task: report/load.py).
DRIFT_FIELDS = ("target_sha256", "chat_template_sha256", "tokenizer_sha256", "enable_thinking", "temperature",
                "top_p", "top_k", "k", "max_new_tokens", "seed", "task", "subset", "data_sha256", "sample_ids",
                "max_turns", "replay", "context_policy", "dtype", "weight_layout", "kv_cache", "compile", "cuda_graphs",
                "captured_attention", "threads",
                "engine", "repeats", "format", "context_points", "tool_format")
# Per-method drift fields ({method: value}): compared for the methods two runs share (a resume may add methods).
PER_METHOD_DRIFT_FIELDS = ("drafter_sha256", "method_options", "draft_products")


# What a drift field meant in runs recorded before it existed
# (captured_attention: every run before it that captured its forwards attended by masked SDPA; a run without
# captured forwards records None, which compares the same)
# (draft_products: a learned drafter's own layers ran on torch's products before `build_method` could move them;
# a model-free method records None, which compares the same)
DRIFT_DEFAULTS = {"cuda_graphs": "off", "captured_attention": "masked-sdpa", "draft_products": "torch"}


def drift_value(key: str, value) -> str:
    """A drift field's value in comparable form (the selected samples compare as a set)."""
    if key == "sample_ids" and isinstance(value, list):
        value = sorted(value)
    if value is None:
        value = DRIFT_DEFAULTS.get(key)
    return json.dumps(value, sort_keys=True, default=str)


def portable_paths(value):
    """`value` (run.json content) with this machine's paths made portable: the repository's own root becomes a
    relative path and the home directory `~`, so committed runs name files without the machine they ran on."""
    repo = str(Path(__file__).resolve().parents[1]) + os.sep
    home = str(Path.home()) + os.sep
    if isinstance(value, str):
        return value.replace(repo, "").replace(home, "~" + os.sep)
    if isinstance(value, dict):
        return {key: portable_paths(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable_paths(item) for item in value]
    return value


def package_versions() -> dict[str, str]:
    names = ["evalsuite", "torch", "transformers", "safetensors", "tokenizers", "datasets", "pandas", "pyarrow",
             "numpy"]
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def command_line() -> list[str]:
    """This process's command line as run.json records it: the program by its name alone (`evalsuite`, not the
    path of the virtual environment it sits in), so a committed run names no machine's directories."""
    argv = list(sys.argv)
    if argv:
        argv[0] = os.path.basename(argv[0]) or argv[0]
    return argv


def environment() -> dict:
    """The machine and software facts of this process (the device's own facts come from the engine)."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": package_versions(),
        "git_commit": git_commit(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": command_line(),
    }
