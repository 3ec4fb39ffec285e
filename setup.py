"""Packs the bundled data into the package: tasks/, baselines/drafters/ (without eval-runs/) and
baselines/published/ go to evalsuite/_bundled/ in every wheel, so a non-editable install (`pip install .`) has
the task samples and the trained default drafters too (evalsuite/bundled.py finds them). All other metadata is
in pyproject.toml. Editable installs read the repository's own directories and copy nothing."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("tasks", "baselines/drafters", "baselines/published")  # keep in step with evalsuite/bundled.py
# run results, the training inputs (tasks/training/) and training state stay out of wheels
SKIPPED = ("eval-runs", "training", "__pycache__", "*.pyc", "train_state.pt")


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for relative in SHIPPED:
            source = ROOT / relative
            if not source.is_dir():
                raise SystemExit(f"setup.py: {relative}/ is missing; build from a full checkout (or sdist)")
            shutil.copytree(source, Path(self.build_lib) / "evalsuite" / "_bundled" / relative,
                            ignore=shutil.ignore_patterns(*SKIPPED), dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithData})
