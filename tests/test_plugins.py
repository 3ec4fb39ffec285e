"""A plug-in is one file: a copy of the package gets a toy model-free method, a toy engine and a toy task, each as
one new file (the task also its folder in tasks/: its data and task.toml), and runs them through `evalsuite run`
and `evalsuite report` with no other edit; and every capability a consumer branches on is the one the method
declares."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from evalsuite.catalog import ENGINES, METHODS, engine_refusal, engine_spec, method_spec
from evalsuite.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

TOY_METHOD = '''"""A toy model-free method: proposes the anchor token `count` times."""

from __future__ import annotations

import torch

from evalsuite.catalog import MethodSpec, Option, positive
from evalsuite.methods.base import DraftState, Method, Proposal, Sampling

SPEC = MethodSpec("toyrepeat", "proposes the newest token again", options={
    "count": Option(int, "tokens proposed (2)", positive, "must be >= 1", default=2)})


class RepeatMethod(Method):
    name = "toyrepeat"

    def __init__(self, device, count: int):
        self.device, self.count = device, count
        self.ids = torch.empty(0, dtype=torch.long)

    def start_turn(self, ids, features):
        self.ids = ids.cpu()

    def propose(self, k: int, sampling: Sampling, generator) -> Proposal:
        return Proposal(tokens=self.ids[-1:].repeat(min(k, self.count)).to(self.device))

    def commit(self, new_ids, new_features):
        self.ids = torch.cat([self.ids, new_ids.cpu()])

    def state_bytes(self) -> DraftState:
        return DraftState(history=self.ids.numel() * 8)


def build(target, options: dict) -> Method:
    return RepeatMethod(target.device, options.get("count", 2))
'''

TOY_ENGINE = '''"""A toy engine: ours under another name."""

from __future__ import annotations

from evalsuite.catalog import EngineSpec
from evalsuite.engines.hf import HfEngine

SPEC = EngineSpec("toyhf", "our engine, renamed", cpu_dtypes=("float32",))


class ToyEngine(HfEngine):
    name = "toyhf"


def build(config, run_dir):
    return ToyEngine(config)
'''

TOY_TASK = '''"""A toy task: three questions in tasks/toy_qa/test.jsonl, described by tasks/toy_qa/task.toml."""

from __future__ import annotations

from evalsuite.tasks._source import HubSpec, single_turn_trajectories, task_rows, text_field
from evalsuite.tasks.base import LoadOptions, Trajectory, register_task
from evalsuite.tasks.description import describe

TASK = describe("toy-qa")


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    rows = task_rows("toy-qa", options, TASK.data_file(), HubSpec("none/none"))
    items = [(f"toy-{index}", text_field(row, "question", where)) for index, (where, row) in enumerate(rows)]
    return single_turn_trajectories(items, options)
'''

TOY_DESCRIPTION = '''name = "toy-qa"
summary = "three short questions"
licence = "CC0"
source = "tests/test_plugins.py"
files = ["test.jsonl"]
turns = "single turn"
scoring = "none"
'''

QUESTIONS = ["What is two plus two?", "Name a colour.", "Say hello twice."]
NEW_FILES = {"evalsuite/methods/toy_repeat.py": TOY_METHOD, "evalsuite/engines/toy_engine.py": TOY_ENGINE,
             "evalsuite/tasks/toy_qa.py": TOY_TASK}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and not {"__pycache__", "_bundled"} & set(p.relative_to(root).parts)}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the package with the three plug-in files added and nothing else changed."""
    copy = tmp_path_factory.mktemp("plugins") / "checkout"
    shutil.copytree(ROOT / "evalsuite", copy / "evalsuite", ignore=shutil.ignore_patterns("__pycache__", "_bundled"))
    for relative, text in NEW_FILES.items():
        (copy / relative).write_text(text)
    data = copy / "tasks" / "toy_qa" / "test.jsonl"  # the task's folder: its data and its description
    data.parent.mkdir(parents=True)
    (data.parent / "task.toml").write_text(TOY_DESCRIPTION)
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in QUESTIONS))
    # the one change is the new files: every file of the package is as it was (no central list edited)
    assert _files(copy / "evalsuite") == _files(ROOT / "evalsuite") | {p.removeprefix("evalsuite/") for p in NEW_FILES}
    for relative in _files(ROOT / "evalsuite"):
        assert filecmp.cmp(ROOT / "evalsuite" / relative, copy / "evalsuite" / relative, shallow=False), relative
    return copy


def evalsuite(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(checkout), "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1",
           "EVALSUITE_CPU_SAMPLE_S": "0.05", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], cwd=checkout, capture_output=True,
                          text=True, env=env, timeout=600)


def test_the_plugins_are_listed_and_checked_by_their_declarations(checkout):
    listed = evalsuite(checkout, "methods")
    assert listed.returncode == 0 and "toyrepeat" in listed.stdout, listed.stderr
    tasks = evalsuite(checkout, "tasks")
    assert tasks.returncode == 0 and "toy-qa" in tasks.stdout, tasks.stderr
    described = evalsuite(checkout, "tasks", "toy-qa")
    assert described.returncode == 0 and "three short questions" in described.stdout, described.stderr
    typo = evalsuite(checkout, "run", "--method", "toyrepaet", "--task", "toy-qa")
    assert typo.returncode == 2 and "did you mean toyrepeat?" in typo.stderr
    bad = evalsuite(checkout, "run", "--method", "toyrepeat", "--method-option", "toyrepeat.count=0",
                    "--task", "toy-qa", "--engine", "toyhf")
    assert bad.returncode == 2 and "toyrepeat.count=0: must be >= 1" in bad.stderr
    vllm = evalsuite(checkout, "run", "--method", "toyrepeat", "--task", "toy-qa", "--engine", "vllm")
    assert vllm.returncode == 2 and "method 'toyrepeat' is not available (not available in vLLM)" in vllm.stderr


def test_a_toy_method_engine_and_task_run_end_to_end(checkout, tiny_llama_dir):
    run, report = checkout / "run", checkout / "report"
    done = evalsuite(checkout, "run", "--method", "toyrepeat,ngram", "--method-option", "toyrepeat.count=3",
                     "--engine", "toyhf", "--task", "toy-qa", "--target", str(tiny_llama_dir), "--threads", "1",
                     "--max-new-tokens", "6", "--k", "3", "--out", str(run))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    config = json.loads((run / "run.json").read_text())
    assert config["engine"] == "toyhf" and config["task"] == "toy-qa"
    assert config["method_options"] == {"toyrepeat": {"count": 3}}
    turns = pd.read_parquet(run / "turns.parquet")
    assert set(turns.method) == {"ar", "toyrepeat", "ngram"} and set(turns.engine) == {"toyhf"}
    assert sorted(turns.sample_id.unique()) == ["toy-0", "toy-1", "toy-2"]
    by_method = turns.set_index(["sample_id", "method"]).output_ids
    for sample in ("toy-0", "toy-1", "toy-2"):  # lossless at T = 0: every method writes ar's tokens
        assert list(by_method[(sample, "toyrepeat")]) == list(by_method[(sample, "ar")])
    steps = pd.read_parquet(run / "steps.parquet")
    assert steps[steps.method == "toyrepeat"].num_drafted.max() == 3
    built = evalsuite(checkout, "report", str(run), "--out", str(report), "--format", "md", "--resamples", "200")
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert "toyrepeat" in (report / "report.md").read_text()


# ---- every consumer asks the method --------------------------------------------------------------------------------
def test_every_learned_method_has_its_recipe_and_every_recipe_a_learned_method():
    from evalsuite.train.recipes.common import recipe_for, recipes

    learned = {name for name, spec in METHODS.items() if spec.needs_checkpoint}
    assert set(recipes()) == learned
    assert not any(METHODS[name].recognises({"architectures": ["Qwen3ForCausalLM"]}) for name in learned)
    with pytest.raises(UserError, match=r"--method ngram: no training recipe for it; choose one of dflash, dlite"):
        recipe_for("ngram")


def test_batching_is_what_the_method_declares():
    import torch

    from evalsuite.methods.base import Method
    from evalsuite.profile import batched

    for name, spec in METHODS.items():
        module = __import__(f"evalsuite.methods.{spec.module}", fromlist=["build"])
        classes = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Method)
                   and c.__module__ == module.__name__ and getattr(c, "name", None) == name]
        assert classes, name
        assert all(any(k in batched.BATCHED for k in c.__mro__) == spec.batched for c in classes), name

    class Undeclared(Method):  # a learned-looking method that claims batching without a counterpart
        name = "dlite"

    with pytest.raises(RuntimeError, match="no batched counterpart"):
        batched.batching_of(Undeclared())
    assert batched.batching_of(type("Plain", (Method,), {"name": "ngram"})()) == "sequential"
    assert torch  # imported for the method modules


def test_engines_refuse_by_their_declarations_with_one_message():
    vllm, hf = engine_spec("vllm"), engine_spec("hf")
    assert set(ENGINES) >= {"hf", "vllm"}
    assert [m for m in METHODS if "vllm" in METHODS[m].engines] == ["ar", "ngram", "suffix", "eagle3"]
    assert engine_refusal(hf, method_spec("dlite")) == "" and engine_refusal(vllm, method_spec("ngram")) == ""
    refusal = engine_refusal(vllm, method_spec("dlite"))
    assert refusal == ("--engine vllm: method 'dlite' is not available (vLLM has no DLite drafter); vLLM runs ar, "
                       "ngram, suffix, eagle3 (suffix needs arctic-inference in vLLM's venv)")
    assert "use --engine hf" in engine_refusal(vllm, method_spec("eagle3"), {"window": 64})
    from evalsuite.engines import vllm_engine

    with pytest.raises(UserError) as raised:
        vllm_engine.check_methods(["ar", "dlite"])
    assert str(raised.value) == refusal


def test_a_declaration_may_not_use_names_of_its_own_file(tmp_path, monkeypatch):
    from evalsuite import catalog

    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "odd.py").write_text("import torch\nLOCAL = 3\nSPEC = MethodSpec('odd', str(LOCAL))\n")
    monkeypatch.setattr(catalog, "PACKAGE_DIR", tmp_path)
    with pytest.raises(NameError, match="odd.py: SPEC may use literals and the names of evalsuite.catalog only"):
        catalog.declared("methods", catalog.MethodSpec)
    (tmp_path / "methods" / "odd.py").write_text("SPEC = MethodSpec('odd', 'fine')\n")
    (tmp_path / "methods" / "twin.py").write_text("SPEC = MethodSpec('odd', 'again')\n")
    with pytest.raises(ValueError, match="already declared"):
        catalog.declared("methods", catalog.MethodSpec)
