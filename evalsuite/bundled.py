"""Data that ships with evalsuite: the tasks (`tasks/`: each task's samples, README and task.toml), the trained
default drafters (`baselines/drafters/`) and the published numbers (`baselines/published/`).

In a source checkout or an editable install these are the repository's own directories. A wheel, and so a
non-editable `pip install .`, carries copies inside the package under `evalsuite/_bundled/` (setup.py copies
them at build time), so every install finds the same files by the same relative path. Wheels leave out the
drafters trained for targets other than the default (`baselines/drafters/<target>/`, see `is_target_folder`):
they stay in the repository.
"""

from __future__ import annotations

from pathlib import Path

from evalsuite.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED_ROOT = PACKAGE_DIR / "_bundled"  # in a built wheel
SOURCE_ROOT = PACKAGE_DIR.parent  # the repository, in a checkout or an editable install
SHIPPED = ("tasks", "baselines/drafters", "baselines/published")  # what setup.py packs (see also MANIFEST.in)


def bundled_path(relative: str) -> Path:
    """Where the bundled `relative` (one of SHIPPED, or a path below one) is: the packaged copy when there is
    one, else the repository's. The result may not exist (see `require_bundled`)."""
    return PACKAGED_ROOT / relative if packaged() else SOURCE_ROOT / relative


def require_bundled(relative: str, what: str, instead: str) -> Path:
    """`bundled_path(relative)`, or a one-line UserError when this install lacks the bundled data."""
    path = bundled_path(relative)
    if not path.exists():
        raise UserError(f"{what} is not in this install ({relative}/ is missing: evalsuite was installed without "
                        f"its bundled data); install it from the repository (pip install -e . or a wheel built "
                        f"there) or {instead}")
    return path


def packaged() -> bool:
    """Whether this install reads a wheel's packaged copies (else the repository's own directories)."""
    return PACKAGED_ROOT.is_dir()


def is_target_folder(path: Path) -> bool:
    """Whether `path` (a folder in baselines/drafters/) holds the drafters of a non-default target, i.e. drafter
    folders rather than being one itself. Wheels leave these out (setup.py applies this rule; MANIFEST.in names
    them, checked by tests/test_packaging.py)."""
    return path.is_dir() and not (path / "config.json").exists() and \
        any((child / "config.json").exists() for child in path.iterdir() if child.is_dir())
