"""The replay protocol and the registry of replay modes.

A replay mode (`--replay`: logged, free, closed; run.json `replay`) is a `MethodReplay` subclass registered under its
name (`register_replay`, `replay_type`). An instance is one method's replay of one trajectory: before turn i the
runner asks `context(i)`, after it hands back the reply (`record_reply(i, text)`); `has_turn(i)` says whether turn i
exists (a replay may learn only from reply i whether turn i + 1 does: the closed loop; the runner asks after it);
`turn_extra(i)` gives the rows of the mode's own tables for the turn (stored with it). The class itself answers the
runner's questions about the mode: whether the data suits it (`check_data`), what it settles once the target's chat
template is known (`configure`), its notes in run.json (`describe`), and whether a stored run's contexts can be rebuilt
from its stored replies (`not_rebuilt`). `for_trajectory` builds the replays of every method of one trajectory, so a
mode may share one loop between methods.

The runner's timing loop knows nothing about replay modes or policies: it asks the replay for contexts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar

from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.replay.context import ContextPolicy, Render, TurnContext
from evalsuite.tasks.base import Trajectory

REPLAYS: dict[str, type[MethodReplay]] = {}


@dataclass(frozen=True)
class ReplaySetup:
    """What every replay of a run is built from: the context policy, the renderer of a trajectory's messages (its
    tools bound), and the run's settings a mode may use."""

    policy: ContextPolicy
    render_for: Callable[[Trajectory], Render]
    max_turns: int | None = None
    context_points: list[int] | None = None
    task: str = ""
    temperature: float = 0.0
    tool_format: str | None = None


class MethodReplay(ABC):
    """One method's replay of one trajectory (see the module's docstring)."""

    mode: ClassVar[str]
    not_rebuilt: ClassVar[str] = ""  # why a stored run's contexts cannot be rebuilt from its replies ("": they can)

    @abstractmethod
    def has_turn(self, index: int) -> bool:
        """Whether turn `index` exists (up to --max-turns)."""

    @abstractmethod
    def context(self, index: int) -> TurnContext:
        """The context of turn `index`: the ids to decode from, or a recorded skip."""

    @abstractmethod
    def record_reply(self, index: int, text: str | None) -> None:
        """After turn `index`: the model's reply text, or None when the turn was skipped."""

    def turn_extra(self, index: int) -> dict[str, tuple[dict, object]]:
        """Rows of other tables for turn `index` after its reply (table → (row without the key columns, its
        pyarrow schema)); the runner stores them with the turn (`RunStore.write_turn(extra=...)`). None here."""
        return {}

    def replay_stored(self, index: int, output_text: str | None) -> TurnContext:
        """Turn `index` as a stored run saw it: its context, then its stored reply (None when it was skipped), so
        the history continues exactly as it did (resume, `evalsuite compare`, span labelling)."""
        context = self.context(index)
        self.record_reply(index, None if context.skipped else output_text)
        return context

    # ---- the mode --------------------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def for_trajectory(cls, trajectory: Trajectory, methods, setup: ReplaySetup) -> dict[str, MethodReplay]:
        """Every method's replay of `trajectory`, keyed by method."""

    @classmethod
    def check_data(cls, config: RunConfig, trajectories: list[Trajectory]) -> None:
        """Refuse (UserError) data this mode cannot replay as configured; before the engine loads."""

    @classmethod
    def configure(cls, config: RunConfig, chat_template: str | None) -> RunConfig:
        """The run's settings once the target's chat template is known (a mode may resolve its own)."""
        return config

    @classmethod
    def describe(cls, config: RunConfig, chat_template: str | None) -> dict:
        """The mode's notes in run.json."""
        return {}


def register_replay(cls: type[MethodReplay]) -> type[MethodReplay]:
    """Class decorator: the replay mode `cls.mode`."""
    REPLAYS[cls.mode] = cls
    return cls


def replay_type(mode: str) -> type[MethodReplay]:
    """The replay mode named `mode` (resolved: not `auto`)."""
    if mode not in REPLAYS:
        raise UserError(f"replay mode {mode!r}: choose from {', '.join(REPLAYS)}")
    return REPLAYS[mode]
