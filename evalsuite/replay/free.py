"""Free replay (`--replay free`): after each turn the model's own reply is appended to the history.

`FreeReplay` keeps one method's view of one trajectory: the conversation history so far, how many of its replies
came from the model (and, in logged replay, from the log), and whether the history can still go on. A skipped turn
produces no reply, so later turns have no history to continue from and are recorded skips that name the turn. Raw
`prompt_ids` turns ignore the history; their label is `raw`.

`--context-points`: only the first turn whose context reaches each point is decoded; the others are recorded skips.
A one-turn sample whose turn marks a document (`Turn.cut_at`, e.g. LongBench v2) is instead decoded once per point,
turn i at point i: the document cut to the longest prefix whose rendered prompt (with the rest of the message, e.g.
the question) fits in the point; a document too short for a point is a recorded skip. The cut tokens are the
turn's `dropped_tokens`.
"""

from __future__ import annotations

from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.replay.base import MethodReplay, ReplaySetup, register_replay
from evalsuite.replay.context import ContextPolicy, Render, TurnContext
from evalsuite.tasks.base import Trajectory, Turn


@register_replay
class FreeReplay(MethodReplay):
    mode = "free"
    no_reply = "produced no reply (free replay)"  # why a skipped turn leaves no history, in the skip reason

    def __init__(self, trajectory: Trajectory, policy: ContextPolicy, render: Render, max_turns: int | None = None,
                 context_points: list[int] | None = None, cuts: dict | None = None):
        self.trajectory = trajectory
        self.policy = policy
        self.render = render
        self.turn_count = len(trajectory.turns[:max_turns])
        self.point_mode = bool(context_points)
        self.points = sorted(context_points or [])  # --context-points not reached yet
        first = trajectory.turns[0] if len(trajectory.turns) == 1 else None
        # a one-turn document decoded at every point: turn i is point i
        self.cut_points = list(self.points) if self.point_mode and first is not None and first.cut_at is not None \
            and first.prompt_ids is None else []
        if self.cut_points:
            self.turn_count = len(self.cut_points[:max_turns])
        # the document's renderings ("full", "bare", and each point's ids), shared by the methods of a trajectory
        self.cuts = {} if cuts is None else cuts
        self.history: list[dict] = []
        self.logged_replies = 0  # replies in the history taken from the log
        self.model_replies = 0  # replies in the history the model produced
        self.broken = ""  # why later turns have no history to continue from

    @classmethod
    def for_trajectory(cls, trajectory, methods, setup: ReplaySetup) -> dict[str, MethodReplay]:
        render = setup.render_for(trajectory)
        cuts: dict = {}
        return {name: cls(trajectory, setup.policy, render, setup.max_turns, setup.context_points, cuts)
                for name in methods}

    @classmethod
    def check_data(cls, config: RunConfig, trajectories: list[Trajectory]) -> None:
        if config.context_points and any(len(t.turns) > 1 for t in trajectories):
            raise UserError(f"--context-points: task {config.task} replays the model's own replies (free), but "
                            "the turns between points are not decoded; use --replay logged")

    def has_turn(self, index: int) -> bool:
        return index < self.turn_count

    def context(self, index: int) -> TurnContext:
        if self.cut_points:
            return self._cut_to(self.cut_points[index])
        turn = self.trajectory.turns[index]
        if turn.prompt_ids is not None:
            ids, dropped, skip = self.policy.fit_ids(list(turn.prompt_ids))
            return self._at_points(TurnContext("raw", ids, 0, dropped, skip))
        label = self.label()
        if self.broken:
            return TurnContext(label, [], skip_reason=self.broken)
        self.history.extend(turn.new_messages)
        ids, dropped_messages, dropped_tokens, skip = self.policy.fit_messages(
            self.history, len(turn.new_messages), self.render)
        return self._at_points(TurnContext(label, ids, dropped_messages, dropped_tokens, skip))

    def _cut_to(self, point: int) -> TurnContext:
        """The one turn with its document cut to the longest prefix whose rendered prompt has at most `point`
        tokens (found by bisection over the document's characters)."""
        turn = self.trajectory.turns[0]
        *before, message = turn.new_messages
        content = message["content"]
        document, rest = content[:turn.cut_at], content[turn.cut_at:]

        def render(chars: int) -> list[int]:
            return self.render([*before, {**message, "content": document[:chars] + rest}])

        if not self.cuts:  # the prompt with its whole document and without any of it, once per trajectory
            self.cuts.update(full=render(len(document)), bare=render(0))
        full, bare = self.cuts["full"], self.cuts["bare"]
        if len(full) < point:
            return TurnContext("free", full, skip_reason=f"the whole prompt is {len(full):,} tokens, short of the "
                                                         f"context point {point:,} (--context-points)")
        if len(bare) > point:
            return TurnContext("free", bare, skip_reason=f"the prompt without its document is longer than the "
                                                         f"context point {point:,} (--context-points)")
        if point not in self.cuts:
            low, high = 0, len(document)  # render(low) fits; render(high) does not
            while high - low > 1:
                middle = (low + high) // 2
                if len(render(middle)) <= point:
                    low = middle
                else:
                    high = middle
            self.cuts[point] = render(low)
        ids = self.cuts[point]
        if len(ids) > self.policy.window.budget:
            return TurnContext("free", ids, skip_reason=f"context point {point:,}: leaves no room for a decode in "
                                                        f"the target's {self.policy.window.max_context:,}-token window")
        return TurnContext("free", ids, dropped_tokens=len(full) - len(ids), context_point=point)

    def _at_points(self, context: TurnContext) -> TurnContext:
        """--context-points: only the first turn whose context reaches each point is decoded; the others are
        recorded skips (their context is prefilled with the next decoded turn's)."""
        if not self.point_mode or context.skipped:
            return context
        reached = [p for p in self.points if context.context_len >= p]
        if reached:
            self.points = [p for p in self.points if p > context.context_len]
            context.context_point = max(reached)
        elif self.points:
            context.skip_reason = (f"between context points: {context.context_len:,} tokens, the next point is "
                                   f"{self.points[0]:,} (--context-points)")
        else:
            context.skip_reason = "past the last context point (--context-points)"
        return context

    def record_reply(self, index: int, text: str | None) -> None:
        if self.cut_points:  # each point's context is the document alone: no history
            return
        turn = self.trajectory.turns[index]
        if turn.prompt_ids is not None or self.broken:
            return
        reply = self.reply(turn, text)
        if reply is None:
            self.broken = f"turn {index} was skipped and {self.no_reply}, so this turn has no history to continue from"
        else:
            self.history.append(reply)

    def reply(self, turn: Turn, text: str | None) -> dict | None:
        """The history message that follows `turn`: the model's reply, None when the turn was skipped."""
        if text is None:
            return None
        self.model_replies += 1
        return {"role": "assistant", "content": text}

    def label(self) -> str:
        """Where the replies in the next context came from (TurnRecord.replay)."""
        return "free"
