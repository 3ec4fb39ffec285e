"""What a closed-loop task implements: an environment that turns the model's replies into executed actions and their
observations (`--replay closed`, evalsuite/replay/closed.py drives it).

An `Environment` is one trajectory's world. The closed replay asks it for the trajectory as the loop runs it
(`trajectory`: its prompts and tools), opens each user turn (`begin_turn`), hands it every reply of the model
(`step`: the calls the reply makes are executed, the observations come back as messages, and the environment says
whether the user turn is over), tells it when a decode was skipped (`interrupt`), and asks for its verdict once the
loop has ended (`finish`). It never sees the engine: the replay decodes and passes the reply text.

A task registers its environment under its name (`register_environment`); `task_environment(name)` is how the
configuration and the closed replay ask a task whether it has one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from evalsuite.tasks.base import Trajectory


@dataclass
class StepLog:
    """What one reply did in the environment (a row of the tool_calls table)."""

    step: int  # decode index within the user turn
    calls: list[str] = field(default_factory=list)  # the reply's calls as the records show them (refused ones too)
    result_bytes: list[int] = field(default_factory=list)  # UTF-8 size of each call's observation
    errors: list[str] = field(default_factory=list)  # per call: "" or the execution error (or why it was refused)
    parse_error: str = ""  # the reply tried to call functions and could not be parsed
    executed: list[bool] = field(default_factory=list)  # per call: run against the environment (schema passed)
    results: list[str] = field(default_factory=list)  # the executed calls' results (for the check; not stored)
    forms: list[str] = field(default_factory=list)  # per call: how the reply wrote it (e.g. python | tag | fence)


@dataclass
class StepOutcome:
    """The environment's answer to one reply."""

    assistant: dict  # the reply as the history keeps it (e.g. an assistant message with `tool_calls`)
    messages: list[dict]  # the observations that follow it in the history (tool results, error observations)
    log: StepLog
    stop: str = ""  # "" (the model acts again in this user turn) | why the user turn is over (no_calls, step_limit)


@dataclass
class Verdict:
    """The environment's score of a finished loop."""

    valid: bool
    error_type: str = ""  # e.g. BFCL's multi_turn:instance_state_mismatch
    message: str = ""
    turn: int | None = None  # the user turn where the check failed

    def text(self) -> str:
        if self.valid:
            return "solved"
        where = "" if self.turn is None else f" (user turn {self.turn})"
        return f"{self.error_type}{where}: {self.message}"[:500]


class Environment(ABC):
    """One trajectory's environment in a closed loop. `tool_format` is how the model is asked for calls (native: the
    chat template's own tools; prompt: the task's prompted format)."""

    def __init__(self, trajectory: Trajectory, tool_format: str):
        self.tool_format = tool_format

    @property
    @abstractmethod
    def trajectory(self) -> Trajectory:
        """The trajectory as the loop runs it: its user turns (no logged replies), prompts and tools."""

    @abstractmethod
    def begin_turn(self, user_turn: int) -> None:
        """User turn `user_turn` starts (its messages are the next context)."""

    @abstractmethod
    def step(self, reply: str) -> StepOutcome:
        """The model replied: execute its calls; what follows the reply in the history, and whether the turn is
        over."""

    @abstractmethod
    def interrupt(self, stop: str) -> None:
        """The loop ended the current user turn before the model did (`stop`: e.g. a skipped decode)."""

    @abstractmethod
    def finish(self, reason: str = "") -> Verdict | None:
        """The loop is over (`reason`: why it ended early, "" when it ran to the end): the verdict, or None when the
        trajectory has nothing to check against."""

    @classmethod
    def require(cls) -> None:
        """Raise a one-line UserError when this environment cannot run here (a missing extra); before any model."""

    @classmethod
    @abstractmethod
    def describe(cls, tool_format: str, rendering: str = "") -> dict:
        """run.json's notes on the environment (`rendering`: how the chat template renders the tools, if not its own
        way)."""


ENVIRONMENTS: dict[str, type[Environment]] = {}


def register_environment(task: str):
    """Class decorator: the environment of task `task`'s closed loop."""

    def wrap(cls: type[Environment]) -> type[Environment]:
        ENVIRONMENTS[task] = cls
        return cls

    return wrap


def task_environment(task: str) -> type[Environment] | None:
    """The environment task `task` registered, or None: the task has no closed loop."""
    import evalsuite.tasks  # noqa: F401  (registers every adapter and its environment)

    return ENVIRONMENTS.get(task)
