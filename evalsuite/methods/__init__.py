"""Drafting methods, one module each. Importing this package registers them all."""

import importlib
import pkgutil

from evalsuite.methods.base import METHODS, Drafter, DraftState, Proposal, Sampling, get_method

for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base" and not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["METHODS", "Drafter", "DraftState", "Proposal", "Sampling", "get_method"]
