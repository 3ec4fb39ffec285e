"""BFCL v3 multi-turn: the task's data (data.py, logged replay of the ground-truth calls) and its closed-loop
environment (environment.py, `--replay closed`): the target's calls parsed in BFCL's prompting format (calls.py) or
the chat template's native one (native_calls.py), executed on bfcl-eval's simulated backends (backends.py), and
scored by BFCL's state-based check (check.py). Importing the package registers the task and its environment."""

from evalsuite.tasks.bfcl_v3 import environment  # noqa: F401  (registers the closed loop's environment)
from evalsuite.tasks.bfcl_v3.data import bfcl_tool, call_from_python, load

__all__ = ["bfcl_tool", "call_from_python", "load"]
