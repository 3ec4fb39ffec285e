"""Run configuration, and the environment facts every run writes to run.json."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from evalsuite.errors import UserError

REPLAY_MODES = ("auto", "logged", "free")
CONTEXT_POLICIES = ("stop", "truncate-left")


@dataclass
class RunConfig:
    methods: list[str]
    task: str
    target: str = "default"
    drafters: dict[str, str] = field(default_factory=dict)  # method → checkpoint dir or HF id
    device: str = "cpu"
    dtype: str | None = None
    weight_layout: str = "auto"  # the target's Linear weight storage (TargetModel.load); resolved in run.json
    kv_cache: str = "static"  # the target's KV cache: static (evalsuite.kv_cache) | dynamic (transformers')
    compile: bool = False  # decode and verify forwards through torch.compile
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
    context_policy: str = "stop"
    max_turns: int | None = None
    enable_thinking: bool = False
    data_path: str | None = None
    subset: str | None = None
    warmup: bool = True
    repeats: int = 1  # each turn is decoded this many times from the same generator state; the median is kept
    method_options: dict[str, dict] = field(default_factory=dict)
    engine: str = "hf"  # hf (ours) | vllm (evalsuite/engines/vllm_engine.py)
    sample_ids: list[str] | None = None  # exact samples to run (instead of a seeded --limit subset)
    threads: int | None = None  # torch intra-op threads (None: torch's default); the count used is recorded

    def validate(self) -> None:
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
        if self.replay not in REPLAY_MODES:
            raise UserError(f"--replay {self.replay}: choose from {', '.join(REPLAY_MODES)}")
        if self.context_policy not in CONTEXT_POLICIES:
            raise UserError(f"--context-policy {self.context_policy}: choose from {', '.join(CONTEXT_POLICIES)}")
        if self.max_turns is not None and self.max_turns < 1:
            raise UserError(f"--max-turns {self.max_turns}: must be >= 1")
        if not 1 <= self.repeats <= 100:
            raise UserError(f"--repeats {self.repeats}: must be between 1 and 100")
        if not self.methods:
            raise UserError("--method: name at least one method")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads {self.threads}: must be >= 1")
        if self.sample_ids is not None:
            if not self.sample_ids:
                raise UserError("--sample-ids: name at least one sample id")
            if self.limit is not None:
                raise UserError("--sample-ids and --limit: give one of them (the ids already fix the samples)")
            repeated = sorted({i for i in self.sample_ids if self.sample_ids.count(i) > 1})
            if repeated:
                raise UserError(f"--sample-ids: {', '.join(repeated)} given more than once")

    def as_dict(self) -> dict:
        return asdict(self)


# Fields of run.json whose change makes two runs' numbers incomparable; --resume refuses to mix them and
# `evalsuite report` refuses to merge them (some only among runs of one task: report/load.py).
DRIFT_FIELDS = ("target_sha256", "chat_template_sha256", "tokenizer_sha256", "enable_thinking", "temperature",
                "top_p", "top_k", "k", "max_new_tokens", "seed", "task", "subset", "data_sha256", "sample_ids",
                "max_turns", "replay", "context_policy", "dtype", "weight_layout", "kv_cache", "compile", "threads",
                "engine", "repeats")
# Per-method drift fields ({method: value}): compared for the methods two runs share (a resume may add methods).
PER_METHOD_DRIFT_FIELDS = ("drafter_sha256", "method_options")


def drift_value(key: str, value) -> str:
    """A drift field's value in comparable form (the selected samples compare as a set)."""
    if key == "sample_ids" and isinstance(value, list):
        value = sorted(value)
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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def environment(device: torch.device) -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": package_versions(),
        "git_commit": git_commit(),
        "device_name": device_name(device),
        "cuda": torch.version.cuda,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
    }
