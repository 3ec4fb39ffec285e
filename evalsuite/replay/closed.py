"""Closed replay (`--replay closed`, docs/closed_loop.md): the target runs as an agent in its task's environment.

The loop: decode → the environment turns the reply into executed calls and their observations → the next context,
until the environment ends the user turn (a reply that calls nothing, or its step limit); then the next user message
follows, or the trajectory ends. The task supplies the environment (`evalsuite.tasks.environment`: its prompts and
tools, the execution, the verdict); this module knows no task and never sees the engine (the runner decodes and hands
back the reply text).

- `ClosedSession`: one loop over one trajectory, driven by one method's replies, the *leader*. Every decode is one
  recorded turn (turn index = decode index across the trajectory).
- `ClosedReplay`: one method's view of a session behind the `MethodReplay` protocol; `closed_replays` builds them:
  at T=0 one session led by `ar` for every method (tools executed once, from `ar`'s reply; each method's reply is
  compared with `ar`'s), at T>0 one session per method (pairing with `ar` is then by turn index only).
- The `tool_calls` table (`TOOLS_SCHEMA`, stored beside turns.parquet): per (method, sample, turn) the user turn and
  step, the reply's calls, their observations' size in bytes, per call its error, whether it was executed and its
  form, a parse error, why the user turn stopped there, the loop (shared | own), `matches_ar`, and on the loop's
  last decode `solved` and `check` (the environment's verdict).
- `--tool-format`: native (the chat template's own tools and calls) where the template takes `tools`, else prompt
  (`resolve_tool_format`); the run records the resolved one.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import pandas as pd
import pyarrow as pa

from evalsuite.config import TOOL_FORMATS, RunConfig
from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError
from evalsuite.replay.base import MethodReplay, ReplaySetup, register_replay
from evalsuite.replay.context import ContextPolicy, Render, TurnContext
from evalsuite.store.run_store import read_table
from evalsuite.target.chat import template_features
from evalsuite.tasks.base import Trajectory
from evalsuite.tasks.environment import Environment, StepLog, Verdict, task_environment

CLOSED = "closed"  # the replay mode, and the replay label of closed-loop turns
SHARED, OWN = "shared", "own"  # one loop led by ar for every method (T=0) | each method its own loop (T>0)
NATIVE, PROMPT = TOOL_FORMATS  # --tool-format: the template's own tools and calls | the task's prompted format
TOOLS_TABLE = "tool_calls"
TOOLS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("method", pa.string()), ("task", pa.string()), ("sample_id", pa.string()),
    ("turn", pa.int64()), ("user_turn", pa.int64()), ("step", pa.int64()), ("calls", pa.list_(pa.string())),
    ("result_bytes", pa.list_(pa.int64())), ("errors", pa.list_(pa.string())), ("parse_error", pa.string()),
    ("stop", pa.string()), ("loop", pa.string()), ("matches_ar", pa.bool_()),
    ("executed", pa.list_(pa.bool_())), ("forms", pa.list_(pa.string())), ("solved", pa.bool_()),
    ("check", pa.string()),
])


def resolve_tool_format(requested: str | None, template: str | None) -> str:
    """--tool-format: as given, or (None/auto) native where the chat template takes `tools`, else prompt."""
    if requested not in (None, "", "auto"):
        return requested
    return NATIVE if template and template_features(template)["tools"] else PROMPT


class ClosedSession:
    """One closed loop over one trajectory (the environment's), driven by the *leader*'s replies. Decode i of the
    loop is turn i of the records; `where[i]` is its (user turn, step within it).

    After the leader's reply to decode i the environment executes its calls and says what follows: another step of
    the same user turn (the context is the history plus the observations), or the end of the user turn; then the
    next user turn, or the end. Other methods may follow the same session (`shared`, at T=0): they get the leader's
    contexts, their replies are only compared with the leader's (`matches_ar`)."""

    def __init__(self, environment: Environment, policy: ContextPolicy, render: Render, leader: str, shared: bool,
                 max_decodes: int | None = None):
        self.environment = environment
        self.trajectory = environment.trajectory
        self.policy, self.render, self.leader, self.shared = policy, render, leader, shared
        self.max_decodes = max_decodes
        self.verdict: Verdict | None = None  # the environment's check, once the loop ended
        self.history: list[dict] = []
        self.contexts: dict[int, TurnContext] = {}
        self.where: dict[int, tuple[int, int]] = {}
        self.steps: dict[int, StepLog] = {}  # what the leader's reply to each decode executed
        self.stops: dict[int, str] = {}  # "" (another step follows) | no_calls | step_limit | skipped | max_turns
        self.replies: dict[int, dict[str, str | None]] = {}
        self.decoded = 0  # decodes the leader has replied to
        self.next: tuple[int, int] | None = (0, 0) if self.trajectory.turns else None
        self.broken = ""
        self._tail = 0  # messages the latest step added (protected from truncate-left)

    def has_turn(self, index: int) -> bool:
        return index < self.decoded or (index == self.decoded and self.next is not None)

    def context(self, index: int) -> TurnContext:
        if index in self.contexts:
            return self.contexts[index]
        if index != self.decoded or self.next is None:
            raise RuntimeError(f"closed loop: decode {index} does not follow (the leader has replied to "
                               f"{self.decoded} decodes)")
        user_turn, step = self.where[index] = self.next
        pairing = "" if self.shared else "turn_index"
        if self.broken:
            context = TurnContext(CLOSED, [], skip_reason=self.broken, pairing=pairing)
        else:
            if step == 0:
                messages = self.trajectory.turns[user_turn].new_messages
                self.history.extend(messages)
                self._tail = len(messages)
                self.environment.begin_turn(user_turn)
            ids, dropped_messages, dropped_tokens, skip = self.policy.fit_messages(self.history, self._tail,
                                                                                  self.render)
            context = TurnContext(CLOSED, ids, dropped_messages, dropped_tokens, skip, pairing)
        self.contexts[index] = context
        return context

    def record(self, index: int, method: str, text: str | None) -> None:
        self.replies.setdefault(index, {})[method] = text
        if method != self.leader:
            return
        if index != self.decoded or index not in self.where:
            raise RuntimeError(f"closed loop: a reply to decode {index} before its context")
        user_turn, step = self.where[index]
        if self.broken or text is None:
            self.broken = self.broken or (f"decode {index} (user turn {user_turn}) was skipped, so the closed loop "
                                          "has no history to continue from")
            self.environment.interrupt("skipped")
            self.steps[index], stop = StepLog(step), "skipped"
        else:
            outcome = self.environment.step(text)  # executes the calls (or gives the error observations)
            self.history.append(outcome.assistant)
            self.history.extend(outcome.messages)
            self._tail = len(outcome.messages)
            self.steps[index], stop = outcome.log, outcome.stop
        self.decoded = index + 1
        if not stop:
            self.next = (user_turn, step + 1)
        elif user_turn + 1 < len(self.trajectory.turns):
            self.next = (user_turn + 1, 0)
        else:
            self.next = None
        if self.next is not None and self.max_decodes is not None and self.decoded >= self.max_decodes:
            self.next, stop = None, stop or "max_turns"
        self.stops[index] = stop
        if self.next is None:
            reason = self.broken or ("--max-turns ended the loop" if stop == "max_turns" else "")
            self.verdict = self.environment.finish(reason)

    def row(self, index: int, method: str) -> dict:
        """The tool_calls row of decode `index` for `method` (TOOLS_SCHEMA, less the key columns)."""
        user_turn, step = self.where[index]
        log = self.steps.get(index, StepLog(step))
        replies = self.replies.get(index, {})
        mine, leader = replies.get(method), replies.get(self.leader)
        matches = None
        if self.shared and method != self.leader and mine is not None and leader is not None:
            matches = mine == leader
        solved, check = None, ""
        if self.verdict is not None and index == self.decoded - 1 and self.next is None:  # the loop's last decode
            solved, check = self.verdict.valid, self.verdict.text()
            differs = [i for i, r in self.replies.items() if method != self.leader and method in r
                       and r[method] is not None and r[method] != r.get(self.leader)]
            if differs:  # this method's own replies would have led elsewhere: its score is unknown
                solved, check = None, (f"not scored: its replies to decodes {differs[:5]} differ from "
                                       f"{self.leader}'s, whose loop ran ({check})")
        return {"user_turn": user_turn, "step": step, "calls": list(log.calls), "result_bytes": list(log.result_bytes),
                "errors": list(log.errors), "parse_error": log.parse_error, "stop": self.stops.get(index, ""),
                "loop": SHARED if self.shared else OWN, "matches_ar": matches, "executed": list(log.executed),
                "forms": list(log.forms), "solved": solved, "check": check}


@register_replay
class ClosedReplay(MethodReplay):
    """One method's view of a closed loop: `has_turn(i)` (known for i + 1 once the leader has replied to i),
    `context(i)`, `record_reply(i, text)` and `turn_extra(i)` (the turn's tool_calls row); `replay_stored` (resume)
    re-executes the stored reply's calls."""

    mode = CLOSED
    not_rebuilt = ("a --replay closed run: its contexts hold the results of executed tool calls, which are not "
                   "rebuilt from the stored replies (its span labels are written during the run)")

    def __init__(self, session: ClosedSession, method: str):
        self.session, self.method = session, method

    @classmethod
    def for_trajectory(cls, trajectory, methods, setup: ReplaySetup) -> dict[str, MethodReplay]:
        environment = task_environment(setup.task)
        if environment is None:
            raise UserError(f"--replay closed: task {setup.task} has no environment to run its tools in")
        tool_format = setup.tool_format or PROMPT
        return closed_replays(trajectory, methods, setup.policy, setup.render_for, setup.temperature,
                              setup.max_turns, environment=lambda t: environment(t, tool_format))

    @classmethod
    def configure(cls, config: RunConfig, chat_template: str | None) -> RunConfig:
        """auto: native where the template takes tools (recorded resolved: a drift field)."""
        return replace(config, tool_format=resolve_tool_format(config.tool_format, chat_template))

    @classmethod
    def describe(cls, config: RunConfig, chat_template: str | None) -> dict:
        rendering = ""
        if config.tool_format == NATIVE and not template_features(chat_template or "")["tools"]:
            rendering = ("this chat template takes no tools: they, the calls and the results are rendered as text in "
                         "the Hermes convention, evalsuite/target/chat.py")
        return describe_closed_loop(task_environment(config.task), config.temperature, config.tool_format, rendering)

    def has_turn(self, index: int) -> bool:
        return self.session.has_turn(index)

    def context(self, index: int) -> TurnContext:
        return self.session.context(index)

    def record_reply(self, index: int, text: str | None) -> None:
        self.session.record(index, self.method, text)

    def turn_extra(self, index: int) -> dict[str, tuple[dict, pa.Schema]]:
        return {TOOLS_TABLE: (self.session.row(index, self.method), TOOLS_SCHEMA)}


def closed_replays(trajectory: Trajectory, methods, policy: ContextPolicy, render_for: Callable[[Trajectory], Render],
                   temperature: float, max_turns: int | None = None, *,
                   environment: Callable[[Trajectory], Environment]) -> dict[str, ClosedReplay]:
    """Every method's closed replay of one trajectory; `environment` makes the trajectory's environment (one per
    loop). At T=0 the methods are lossless: one loop, led by `ar` (its replies' calls are executed once), whose
    contexts every method decodes; at T>0 each method runs its own loop (its own environment), so turn i of two
    methods may have different contexts. `max_turns` caps the decodes."""
    methods = list(methods)

    def session(leader: str, shared: bool) -> ClosedSession:
        world = environment(trajectory)
        return ClosedSession(world, policy, render_for(world.trajectory), leader, shared, max_turns)

    if temperature == 0:
        shared = session(BASELINE if BASELINE in methods else methods[0], True)
        return {m: ClosedReplay(shared, m) for m in methods}
    return {m: ClosedReplay(session(m, False), m) for m in methods}


def describe_closed_loop(environment: type[Environment], temperature: float, tool_format: str = PROMPT,
                         rendering: str = "") -> dict:
    """run.json's `closed_loop`: how the loop ran, what `speedup_turn` pairs, and the environment's own notes."""
    shared = temperature == 0
    return {"closed_loop": {
        "loop": SHARED if shared else OWN,
        "pairing": ("ar's loop, replayed for every method: each turn is paired with ar's decode of the same context; "
                    "tool_calls.matches_ar records whether each method's reply equals ar's") if shared else
                   ("by turn index only: at T>0 every method runs its own loop (its own calls executed), so ar's "
                    "decode of the same turn index saw another context (turns.pairing = turn_index)"),
        **environment.describe(tool_format, rendering),
        "resume": "stored turns are replayed: their stored replies' calls are re-executed against fresh backends",
        "table": f"{TOOLS_TABLE}.parquet: per turn the calls, executed or refused, their results' bytes, errors, "
                 "forms, stop; solved and check on each loop's last decode",
    }}


def read_tool_calls(run_dir) -> pd.DataFrame:
    """The tool_calls rows of a closed-loop run (empty for any other run)."""
    return read_table(Path(run_dir), TOOLS_TABLE, TOOLS_SCHEMA)
