"""The architecture, checked: the import-linter contracts in pyproject.toml hold, they fail when an upward import is
planted (in a temporary copy of the package), and the report and the store import without torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (pip install '.[test]')")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def copy_package(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(ROOT / "evalsuite", copy / "evalsuite", ignore=shutil.ignore_patterns("__pycache__", "_bundled"))
    return copy


def test_the_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout or "broken" not in result.stdout.lower()


@pytest.mark.parametrize("module, planted, contract", [
    ("methods/ngram.py", "from evalsuite.run.runner import Runner", "Layers point down"),
    ("engines/loop.py", "from evalsuite.report import stats", "Layers point down"),
    ("store/run_store.py", "import torch", "need no torch"),
    ("store/records.py", "from evalsuite.target.model import TargetModel", "need no torch"),
    ("target/chat.py", "from evalsuite.store.records import Step", "Layers point down"),
    ("target/model.py", "from evalsuite.run import plan", "Layers point down"),
    ("target/buffers.py", "from evalsuite.target.kv_cache import KVCache", "target is built from its parts"),
    ("store/records.py", "from evalsuite.store.run_store import read_run", "store sits on its records"),
    ("run/resume.py", "from evalsuite.run.plan import make_plan", "run's modules are layered"),
    ("profile/batched.py", "from evalsuite.profile import sweep", "profile is layered"),
    ("profile/memory.py", "from evalsuite.profile.shapes import SHAPES", "profile is layered"),
    ("spans.py", "from evalsuite.store.run_store import read_table", "Layers point down"),
    ("report/tables.py", "from evalsuite.target.model import TargetModel", "need no torch"),
    ("train/data.py", "from evalsuite.train import mixture", "Training sources sit below their selection"),
    ("report/figures.py", "from evalsuite.report.tables import Table", "report's modules are layered"),
    ("report/formatting.py", "from evalsuite.report import policy", "report's modules are layered"),
])
def test_a_planted_upward_import_breaks_a_contract(tmp_path, module, planted, contract):
    copy = copy_package(tmp_path)
    path = copy / "evalsuite" / module
    path.write_text(path.read_text() + f"\n{planted}  # planted by the test\n")
    result = lint(copy)
    assert result.returncode != 0
    assert contract in result.stdout and "BROKEN" in result.stdout


def test_the_report_and_the_store_import_without_torch():
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'transformers'):\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import evalsuite.report, evalsuite.report.build, evalsuite.report.stats, evalsuite.store.run_store, "
            "evalsuite.store.records, evalsuite.run.resume, evalsuite.target.chat, evalsuite.target.embedded, "
            "evalsuite.metrics, evalsuite.config, evalsuite.report.summary\n"
            "from evalsuite.config import RunConfig\n"
            "RunConfig(methods=['dlite', 'ngram'], task='swebench').validate()\n"
            "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
