"""Task adapters, one module each. Importing this package registers them all."""

import importlib
import pkgutil

from evalsuite.tasks.base import TASKS, LoadOptions, TaskInfo, Trajectory, Turn, get_task

for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base" and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["TASKS", "LoadOptions", "TaskInfo", "Trajectory", "Turn", "get_task"]
