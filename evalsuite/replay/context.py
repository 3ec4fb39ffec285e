"""The context policy: what a turn's context may hold in the target's window, and the context a replay hands the
runner each turn (`TurnContext`: the token ids to decode from, or the reason the turn is a recorded skip).

Policies, applied when a turn's rendered context would not leave room in the target's window:
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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
    label: str  # logged | free | mixed | raw | closed: where the replies in this context came from (TurnRecord.replay)
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
