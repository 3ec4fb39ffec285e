"""Replay and context policy: a trajectory → the context the target sees at each turn, for one method.

`MethodReplay` keeps one method's view of one trajectory: the conversation history so far, which turns'
replies in it came from the log and which from the model, and whether the history can still go on. Each
turn it hands the runner a `TurnContext`: the token ids to decode from, or the reason the turn is a
recorded skip. The runner's timing loop knows nothing about replay modes or policies.

History (messages; raw `prompt_ids` turns ignore it):
- `logged`: after each turn the logged assistant reply is appended. A turn without one (the data has none)
  is followed by the model's own reply, and the turns after it say so in their `replay` label:
  `free` when every reply in the context is the model's own, `mixed` when both kinds are there.
- `free`: after each turn the model's own reply is appended.
- A skipped turn produces no reply. Unless a logged reply stands in for it, later turns have no history
  to continue from and are recorded skips that name the turn.

Context policies, applied when a turn's rendered context would not leave room in the target's window:
- `stop`: a context that reaches the window (`max_context - 1` tokens or more) is a recorded skip. A
  decode may still run into the window mid-turn (`stop_reason = context_limit`).
- `truncate-left`: whole oldest messages are dropped, as agent frameworks condense history, until the
  rendered context leaves room for `max_new_tokens + k + 1` tokens. It keeps the system message and the
  first user message (the task), and the newest messages: the turn's own new messages and the assistant reply
  they follow. It drops whole agent steps, oldest first: an assistant message with the tool results or user
  messages that answer it, so a tool call never loses its result. The prompt is re-rendered through the chat
  template, so nothing is cut inside a message or a template header. When the kept messages alone do not
  fit, the turn is a recorded skip. Raw `prompt_ids` turns are cut token-wise from
  the left to the same room.

`stored_contexts` rebuilds the contexts of a stored run from its run.json and stored outputs, without a model
(`evalsuite compare`, `evalsuite label`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from evalsuite.conventions import SKIPPED
from evalsuite.errors import UserError
from evalsuite.tasks.base import LoadOptions, Trajectory, get_task

REPO_ROOT = Path(__file__).resolve().parents[1]

STOP = "stop"
TRUNCATE_LEFT = "truncate-left"

Render = Callable[[list[dict]], list[int]]


@dataclass(frozen=True)
class Window:
    """The target's window and what a decode needs left of it."""

    max_context: int
    max_new_tokens: int
    k: int

    @property
    def budget(self) -> int:
        """The longest context that still leaves room for a full decode: max_new_tokens + k + 1 tokens."""
        return max(self.max_context - self.max_new_tokens - self.k - 1, 1)

    def reaches_limit(self, length: int) -> bool:
        """Too long to decode even one verify step."""
        return length >= self.max_context - 1


@dataclass
class TurnContext:
    replay: str  # logged | free | mixed | raw: where the replies in this context came from
    ids: list[int]  # what the target decodes from (the full context when the turn is skipped)
    dropped_messages: int = 0
    dropped_tokens: int = 0
    skip_reason: str = ""
    pairing: str = ""  # how `ar`'s decode of this turn index relates to this context (TurnRecord.pairing)
    context_point: int = 0  # --context-points: the largest point this turn is the first to reach (0: none)

    @property
    def context_len(self) -> int:
        return len(self.ids)

    @property
    def skipped(self) -> bool:
        return bool(self.skip_reason)


class ContextPolicy:
    name = ""

    def __init__(self, window: Window):
        self.window = window

    def fit_ids(self, ids: list[int]) -> tuple[list[int], int, str]:
        """Raw ids → (ids, dropped tokens, skip reason)."""
        raise NotImplementedError

    def fit_messages(self, messages: list[dict], protected_tail: int, render: Render) -> tuple[list[int], int, int, str]:
        """Messages → (ids, dropped messages, dropped tokens, skip reason)."""
        raise NotImplementedError


class StopPolicy(ContextPolicy):
    name = STOP

    def _skip(self, length: int) -> str:
        if not self.window.reaches_limit(length):
            return ""
        return (f"context of {length} tokens reaches the target maximum of {self.window.max_context} "
                f"(--context-policy stop)")

    def fit_ids(self, ids):
        return ids, 0, self._skip(len(ids))

    def fit_messages(self, messages, protected_tail, render):
        ids = render(messages)
        return ids, 0, 0, self._skip(len(ids))


class TruncateLeftPolicy(ContextPolicy):
    name = TRUNCATE_LEFT

    def fit_ids(self, ids):
        budget = self.window.budget
        if len(ids) <= budget:
            return ids, 0, ""
        return ids[-budget:], len(ids) - budget, ""

    def fit_messages(self, messages, protected_tail, render):
        full = render(messages)
        budget = self.window.budget
        if len(full) <= budget:
            return full, 0, 0, ""
        head, units, tail = split_for_truncation(messages, protected_tail)

        def kept(drop: int) -> list[dict]:
            return head + [m for unit in units[drop:] for m in unit] + tail

        fewest = render(kept(len(units)))
        if len(fewest) > budget:
            return full, 0, 0, (
                f"the {len(head) + len(tail)} messages truncate-left keeps (system and task, the latest reply and this "
                f"turn's new messages) take "
                f"{len(fewest)} tokens, more than the {budget} the target's window of {self.window.max_context} "
                f"leaves after max_new_tokens + k + 1 (--context-policy truncate-left)")
        # the fewest oldest units to drop: the rendered length shrinks as units go, so bisect
        low, high, fits = 1, len(units), {len(units): fewest}
        while low < high:
            mid = (low + high) // 2
            ids = render(kept(mid))
            if len(ids) <= budget:
                high, fits[mid] = mid, ids
            else:
                low = mid + 1
        best = fits[high]
        dropped = sum(len(unit) for unit in units[:high])
        return best, dropped, len(full) - len(best), ""


def make_policy(name: str, window: Window) -> ContextPolicy:
    return {STOP: StopPolicy, TRUNCATE_LEFT: TruncateLeftPolicy}[name](window)


def split_for_truncation(messages: list[dict], protected_tail: int) -> tuple[list[dict], list[list[dict]], list[dict]]:
    """(kept head, droppable units oldest first, kept tail).

    The head runs through the first user message (the task), so it holds the system message before it.
    The tail is the turn's newest `protected_tail` messages plus the assistant reply they follow (the model's
    latest action and what came back to it). A unit is one agent step: an assistant message and the tool results
    or user messages that answer it, so a tool call never loses its result and roles keep alternating.
    """
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    head_end = first_user + 1 if first_user is not None else \
        next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
    tail_start = max(len(messages) - protected_tail, head_end)
    while head_end < tail_start < len(messages) and messages[tail_start].get("role") == "tool" \
            and messages[tail_start - 1].get("role") != "assistant":
        tail_start -= 1  # tool results reach back to the call they answer
    if tail_start > head_end and messages[tail_start - 1].get("role") == "assistant":
        tail_start -= 1
    units: list[list[dict]] = []
    for message in messages[head_end:tail_start]:
        if message.get("role") == "assistant" or not units:
            units.append([message])
        else:
            units[-1].append(message)
    return list(messages[:head_end]), units, list(messages[tail_start:])


class MethodReplay:
    """One method's replay of one trajectory: `context(i)` before turn i, `record_reply(i, text)` after it;
    `has_turn(i)` says whether turn i exists (up to `max_turns`). A replay may learn only from reply i whether
    turn i + 1 exists (the closed loop, `evalsuite.tools.bfcl_loop.ClosedReplay`): the runner asks after it."""

    def __init__(self, trajectory: Trajectory, mode: str, policy: ContextPolicy, render: Render,
                 max_turns: int | None = None, context_points: list[int] | None = None):
        if mode not in ("logged", "free"):
            raise ValueError(f"replay mode {mode!r}")
        self.trajectory = trajectory
        self.mode = mode
        self.policy = policy
        self.render = render
        self.turn_count = len(trajectory.turns[:max_turns])
        self.point_mode = bool(context_points)
        self.points = sorted(context_points or [])  # --context-points not reached yet
        self.history: list[dict] = []
        self.logged_replies = 0  # replies in the history taken from the log
        self.model_replies = 0  # replies in the history the model produced
        self.broken = ""  # why later turns have no history to continue from

    def has_turn(self, index: int) -> bool:
        return index < self.turn_count

    def context(self, index: int) -> TurnContext:
        turn = self.trajectory.turns[index]
        if turn.prompt_ids is not None:
            ids, dropped, skip = self.policy.fit_ids(list(turn.prompt_ids))
            return self._at_points(TurnContext("raw", ids, 0, dropped, skip))
        label = self._label()
        if self.broken:
            return TurnContext(label, [], skip_reason=self.broken)
        self.history.extend(turn.new_messages)
        ids, dropped_messages, dropped_tokens, skip = self.policy.fit_messages(
            self.history, len(turn.new_messages), self.render)
        return self._at_points(TurnContext(label, ids, dropped_messages, dropped_tokens, skip))

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
        """After turn `index`: the model's reply text, or None when the turn was skipped."""
        turn = self.trajectory.turns[index]
        if turn.prompt_ids is not None or self.broken:
            return
        if self.mode == "logged" and turn.logged_reply is not None:
            self.history.append(turn.logged_reply)
            self.logged_replies += 1
        elif text is not None:
            self.history.append({"role": "assistant", "content": text})
            self.model_replies += 1
        else:
            what = "has no logged reply" if self.mode == "logged" else "produced no reply (free replay)"
            self.broken = f"turn {index} was skipped and {what}, so this turn has no history to continue from"

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

    def _label(self) -> str:
        if self.mode == "free" or (self.model_replies and not self.logged_replies):
            return "free"
        return "mixed" if self.model_replies else "logged"


def check_replay_mode(requested: str, trajectories: list[Trajectory], task: str) -> None:
    """An explicit `--replay logged` on data with no logged reply at all would be free replay under another name."""
    if requested != "logged":
        return
    if any(len(t.turns) > 1 for t in trajectories) and not any(t.has_logged_replies for t in trajectories):
        raise UserError(f"--replay logged: task {task} has no logged assistant replies to replay; "
                        "use --replay free (or auto)")


# ---- the contexts of a stored run --------------------------------------------------------------------------------
def stored_contexts(config: dict, turns, chat, pairs: Iterable[tuple[str, str]] | None = None
                    ) -> dict[tuple[str, str, int], TurnContext]:
    """The context every turn of a stored run saw, keyed (method, sample_id, turn), rebuilt as the runner built it:
    the task's data as run.json loaded it (limit, seed, data path, subset), the run's replay mode, context policy and
    window, the target's template (`chat`: a `ChatTokenizer`, no weights needed; it must hash as the run's did), and
    after each turn the run's own stored reply (`MethodReplay.replay_stored`), so free replay continues from it.
    `turns`: the run's turns table (`store.read_run(...).turns`); `pairs`: the (method, sample) pairs to rebuild (all
    the table's when None), every turn up to max_turns. A sample no longer in the task's data has no contexts."""
    check_chat(chat, config)
    if config.get("replay") == "closed":
        raise UserError("a --replay closed run: its contexts hold the results of executed tool calls, which are not "
                        "rebuilt from the stored replies (its span labels are written during the run)")
    task = get_task(config["task"])
    trajectories = task.load(LoadOptions(config.get("limit"), config.get("seed", 0),
                                         _run_path(config.get("data_path")), config.get("subset"),
                                         config.get("format")))
    by_id = {t.sample_id: t for t in trajectories}
    mode = config.get("replay")
    mode = task.default_replay if mode in (None, "", "auto") else mode
    window = Window(int(config.get("target_max_context") or chat.max_context), int(config.get("max_new_tokens", 256)),
                    int(config.get("k", 7)))
    policy = make_policy(config.get("context_policy", STOP), window)
    rows = {(r.method, r.sample_id, int(r.turn)): r for r in turns.itertuples(index=False)}
    if pairs is None:
        pairs = {(m, s) for m, s, _ in rows}
    found = {}
    for method, sample in sorted(set(pairs)):
        trajectory = by_id.get(sample)
        if trajectory is None:
            continue
        render = (lambda messages, tools=trajectory.tools:
                  chat.render(messages, tools, bool(config.get("enable_thinking"))))
        replay = MethodReplay(trajectory, mode, policy, render, config.get("max_turns"), config.get("context_points"))
        index = 0
        while replay.has_turn(index):
            row = rows.get((method, sample, index))
            stored = row is not None and row.stop_reason != SKIPPED and row.output_ids is not None
            text = chat.decode(list(row.output_ids)) if stored else None
            found[(method, sample, index)] = replay.replay_stored(index, text)
            index += 1
    return found


def check_chat(chat, config: dict) -> None:
    """The tokenizer and chat template must be the run's (run.json's hashes), else the rebuilt contexts are not the
    ones the run decoded from."""
    for name, value in chat.hashes().items():
        recorded = config.get(name)
        if recorded and recorded != value:
            what = name.removesuffix("_sha256").replace("_", " ")
            raise UserError(f"target {chat.name}: its {what} hashes to {value}, the run recorded {recorded}; it is "
                            "not the run's target, so the run's contexts cannot be rebuilt (pass the run's target)")


def _run_path(value: str | None) -> str | None:
    """A path as run.json records it (`config.portable_paths`: relative to the repository, or `~/…`)."""
    if not value:
        return value
    path = Path(value).expanduser()
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        return str(REPO_ROOT / path)
    return str(path) if path.exists() else value
