"""Packs the bundled data into the package: tasks/, baselines/drafters/ (without eval-runs/) and
baselines/published/ go to evalsuite/_bundled/ in every wheel, so a non-editable install (`pip install .`) has
the task samples and the trained default drafters too (evalsuite/bundled.py finds them). All other metadata is
in pyproject.toml. Editable installs read the repository's own directories and copy nothing.

Only the default target's drafters (baselines/drafters/<method>/) go into wheels. Drafters trained for another
target (baselines/drafters/<target>/<method>/, e.g. the 32k target's four, 59 MB) stay in the repository: with
them a wheel reached 89 MB, near PyPI's 100 MB limit (evalsuite.bundled.is_target_folder tells them apart)."""

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from evalsuite.bundled import SHIPPED, is_target_folder  # noqa: E402  (stdlib only; no dependency needed to build)
# run results, the training inputs (tasks/training/) and training state stay out of wheels
SKIPPED = ("eval-runs", "training", "__pycache__", "*.pyc", "train_state.pt")


def _skipped(directory: str, names: list[str]) -> set[str]:
    """shutil.copytree's ignore: SKIPPED, and in baselines/drafters/ every folder of another target's drafters
    (one holding drafter folders rather than being one itself)."""
    skipped = set(shutil.ignore_patterns(*SKIPPED)(directory, names))
    if Path(directory).resolve() == (ROOT / "baselines" / "drafters").resolve():
        skipped |= {name for name in names if is_target_folder(Path(directory) / name)}
    return skipped


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
                            ignore=_skipped, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithData})
