"""Logged replay (`--replay logged`): after each turn the logged assistant reply is appended to the history.

A turn without one (the data has none) is followed by the model's own reply, as in free replay, and the turns after
it say so in their label: `free` when every reply in the context is the model's own, `mixed` when both kinds are
there. A skipped turn without a logged reply leaves later turns no history to continue from (recorded skips).
"""

from __future__ import annotations

from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.replay.base import register_replay
from evalsuite.replay.free import FreeReplay
from evalsuite.tasks.base import Trajectory, Turn


@register_replay
class LoggedReplay(FreeReplay):
    mode = "logged"
    no_reply = "has no logged reply"

    @classmethod
    def check_data(cls, config: RunConfig, trajectories: list[Trajectory]) -> None:
        check_replay_mode(config.replay, trajectories, config.task)

    def reply(self, turn: Turn, text: str | None) -> dict | None:
        if turn.logged_reply is not None:
            self.logged_replies += 1
            return turn.logged_reply
        return super().reply(turn, text)

    def label(self) -> str:
        if self.model_replies and not self.logged_replies:
            return "free"
        return "mixed" if self.model_replies else "logged"


def check_replay_mode(requested: str, trajectories: list[Trajectory], task: str) -> None:
    """An explicit `--replay logged` on data with no logged reply at all would be free replay under another name."""
    if requested != "logged":
        return
    if any(len(t.turns) > 1 for t in trajectories) and not any(t.has_logged_replies for t in trajectories):
        raise UserError(f"--replay logged: task {task} has no logged assistant replies to replay; "
                        "use --replay free (or auto)")
