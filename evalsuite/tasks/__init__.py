"""Task adapters, one module (or package) each. Importing this package registers them all (and their closed-loop
environments, `environment.py`)."""

import importlib
import pkgutil

from evalsuite.tasks.base import TASKS, LoadOptions, TaskInfo, Trajectory, Turn, get_task

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("base", "environment", "description") and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["TASKS", "LoadOptions", "TaskInfo", "Trajectory", "Turn", "get_task"]
