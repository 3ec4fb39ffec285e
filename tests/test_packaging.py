"""A wheel (what `pip install .` installs) carries the bundled data: the task samples and the trained default
drafters, found by the same lookups as in a checkout. Built from a copy of the tree, with no network and no
build isolation, then imported from the unpacked wheel in a fresh interpreter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from evalsuite.bundled import SHIPPED, is_target_folder

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json
from pathlib import Path
import evalsuite
from evalsuite.methods.checkpoints import drafter_source
from evalsuite.tasks.base import LoadOptions, DATA_DIR, get_task
from evalsuite.report.published import PUBLISHED_DIR
from evalsuite.errors import UserError
from evalsuite.target.embedded import EMBEDDED, QWEN_CODER_KEY
class Qwen:  # a stand-in for the 32k target: its name, no weights
    name = EMBEDDED[QWEN_CODER_KEY].name
try:
    drafter_source("dlite", {}, Qwen())
    qwen = "found"
except UserError as error:
    qwen = str(error)
print(json.dumps({"qwen": qwen,
    "package": evalsuite.__file__, "tasks": str(DATA_DIR), "published": str(PUBLISHED_DIR),
    "dlite": drafter_source("dlite", {}), "eagle3": drafter_source("eagle3", {}),
    "gsm8k": len(get_task("gsm8k").load(LoadOptions(limit=3))),
    "swebench": len(get_task("swebench").load(LoadOptions(limit=2))),
}))
"""


def _source_copy(destination: Path) -> Path:
    """The files a build reads (no .git, results or reports), so the build's own outputs stay out of the tree."""
    destination.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, destination / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "eval-runs")
    shutil.copytree(ROOT / "evalsuite", destination / "evalsuite", ignore=ignore)
    for relative in SHIPPED:
        shutil.copytree(ROOT / relative, destination / relative, ignore=ignore)
    return destination


def test_wheel_ships_tasks_and_default_drafters(tmp_path):
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} cannot build this pyproject (needs >= 77, the test extra)")
    source = _source_copy(tmp_path / "src")
    (source / "baselines" / "drafters" / "eval-runs").mkdir()  # present in a checkout, never shipped
    (source / "baselines" / "drafters" / "eval-runs" / "steps.parquet").write_text("x")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("evalsuite-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for method in ("dlite", "dflash", "dspark", "eagle3"):
        assert f"evalsuite/_bundled/baselines/drafters/{method}/model.safetensors" in names
        assert f"evalsuite/_bundled/baselines/drafters/{method}/config.json" in names
    assert "evalsuite/_bundled/tasks/gsm8k/test.jsonl" in names
    assert not [n for n in names if "eval-runs" in n]
    assert not [n for n in names if "/training/" in n or "training-" in n]  # training inputs: train from a checkout
    targets = [d.name for d in (ROOT / "baselines" / "drafters").iterdir() if is_target_folder(d)]
    assert "qwen2.5-coder-0.5b" in targets  # other targets' drafters stay in the repository (setup.py)
    assert not [n for n in names if any(f"/baselines/drafters/{t}/" in n for t in targets)]
    assert "evalsuite/_bundled/tasks/gsm8k/task.toml" in names and "evalsuite/_bundled/tasks/README.md" in names
    assert wheel.stat().st_size < 80 * 2**20, "the wheel should stay well below PyPI's 100 MB limit"

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    packaged = site / "evalsuite"
    assert Path(found["package"]).parent == packaged  # the unpacked wheel, not the checkout
    assert found["tasks"] == str(packaged / "_bundled" / "tasks")
    assert found["published"] == str(packaged / "_bundled" / "baselines" / "published")
    assert found["dlite"] == str(packaged / "_bundled" / "baselines" / "drafters" / "dlite")
    assert found["eagle3"] == str(packaged / "_bundled" / "baselines" / "drafters" / "eagle3")
    assert found["gsm8k"] == 3 and found["swebench"] == 2
    assert "wheels carry only the default target's drafters" in found["qwen"]
    assert "baselines/drafters/qwen2.5-coder-0.5b/dlite/" in found["qwen"] and "\n" not in found["qwen"]


def test_manifest_prunes_every_other_targets_drafters():
    """The sdist leaves out what wheels leave out: MANIFEST.in prunes each folder of another target's drafters."""
    manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
    for folder in (ROOT / "baselines" / "drafters").iterdir():
        if is_target_folder(folder):
            assert f"prune baselines/drafters/{folder.name}" in manifest, folder.name
