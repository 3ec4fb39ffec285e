"""Span labels for every emitted token of a turn: its kind (tool call, code, prose, other) and its copy length.

Pure Python (plus pyarrow for the table): no torch, no model. The rules are documented in docs/spans.md.

**Kind.** The reply's text is decoded token by token (`token_char_spans`, character offsets per token), the text
is cut into regions, and each token takes the kind of most of its characters:
- `tool_call`: a `<tool_call>…</tool_call>` block (the Hermes/Qwen convention, which `chat.fit_to_template`
  renders for templates without tool support), a Python call list at a line start as BFCL asks for it
  (`[f(a=1), g(b=2)]`),
  a JSON object or array of objects at a line start (`{"…` or `[{"…`), a fenced block tagged json; for
  bfcl-v3 also a bare call line (`f(a=1)`);
- `code`: any other fenced block (```bash, ```python, ``` …, ~~~), fences included, and a shell line
  outside a fence (`$ cmd`);
- `prose`: a line outside those regions with a word of two or more letters;
- `other`: the rest (lines of symbols or numbers only, e.g. `#### 18`) and special tokens (`<|im_end|>`).
Blank lines and the whitespace between regions take the kind of the text before them. An unterminated region
(a reply cut at max_new_tokens) runs to the end of the reply.

**Copy length.** For output position i: the length L of the longest run of tokens ending at i that also occurs
earlier in context + output, i.e. `out[i-L+1..i]` occurs in `context + out[:i]` (spans may start in the context
and run into the output). `context_copy_len` is the same with occurrences inside the context only. Both come from
one online suffix automaton over context + output (O(n)): when token j is added, the suffix link of the new state
is the longest suffix that occurred before. A position is *copied* when its copy length is at least the threshold
(`DEFAULT_THRESHOLD`, recorded with the labels).

**Storage.** The `spans` table (`spans.parquet/` in the run directory): one row per decoded (method, sample_id,
turn) with list columns (`SPANS_SCHEMA`). The runner labels each turn as it decodes it and stores the rows with the
turn (`store.RunStore.write_turn(extra=…)`); `evalsuite label` (evalsuite.labelling) labels a stored run afterwards.
This module only labels: it reads and writes nothing, and imports no torch (both the runner and the report use it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Protocol

import pyarrow as pa

LABELLER_VERSION = "spans-v1"
DEFAULT_THRESHOLD = 8
KINDS = ("tool_call", "code", "prose", "other")
COPY_SPANS = ("copied", "novel")


class Tokenizer(Protocol):
    """What the labeller needs of a tokenizer (a Hugging Face tokenizer has both)."""

    all_special_ids: list[int]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


# ---- character offsets per token ---------------------------------------------------------------------------------
def token_char_spans(decode: Callable[[list[int]], str], ids: list[int]) -> tuple[str, list[int], list[int]]:
    """(text, starts, ends): the decoded text and each token's character span in it.

    Incremental detokenization (as vLLM does it): each token's text is the growth of the decoded window that
    starts a few tokens back, so leading-space rules and multi-byte characters split over tokens decode as in the
    whole text. A token that ends inside a character (the window decodes to U+FFFD) adds no text; the token that
    completes the character gets it, and the empty token is labelled by that character."""
    text_parts: list[str] = []
    length = 0
    starts, ends = [], []
    prefix_offset = read_offset = 0
    for i in range(len(ids)):
        prefix = decode(ids[prefix_offset:read_offset]) if read_offset > prefix_offset else ""
        window = decode(ids[prefix_offset:i + 1])
        start = length
        last = i == len(ids) - 1  # the end flushes whatever is pending (a genuine U+FFFD included)
        if len(window) > len(prefix) and (last or not window.endswith("\ufffd")):
            delta = window[len(prefix):]
            text_parts.append(delta)
            length += len(delta)
            prefix_offset, read_offset = read_offset, i + 1
        starts.append(start)
        ends.append(length)
    return "".join(text_parts), starts, ends


# ---- kinds -------------------------------------------------------------------------------------------------------
_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\n`]*)$", re.M)
_TOOL_TAG = re.compile(r"<tool_call>")
_CALL_LIST = re.compile(r"^[ \t]*\[\s*[A-Za-z_][\w.]*\(", re.M)
_JSON_START = re.compile(r"^[ \t]*(?:\{\s*\"|\[\s*\{\s*\")", re.M)
_BARE_CALL = re.compile(r"^[ \t]*[A-Za-z_][\w.]*\(.*\)[ \t]*$", re.M)
_SHELL_LINE = re.compile(r"^[ \t]*\$ \S[^\n]*$", re.M)
_WORD = re.compile(r"[^\W\d_]{2,}")
JSON_INFO = ("json", "jsonl", "json5", "jsonc")
TASKS_WITH_BARE_CALLS = ("bfcl-v3",)


def _balanced_end(text: str, start: int) -> int:
    """End (exclusive) of the bracketed expression opening at `start`, skipping quoted strings; len(text) when it
    never closes (a reply cut short)."""
    depth, i, quote = 0, start, ""
    closers = {"[": "]", "{": "}", "(": ")"}
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in closers:
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _line_end(text: str, position: int) -> int:
    end = text.find("\n", position)
    return len(text) if end < 0 else end + 1


def _regions(text: str, task: str) -> list[tuple[int, int, str]]:
    """Structured regions (start, end, kind), in order and not overlapping: the earliest opener wins."""
    openers: list[tuple[re.Pattern, str]] = [(_TOOL_TAG, "tag"), (_FENCE_OPEN, "fence"), (_CALL_LIST, "call_list"),
                                             (_JSON_START, "json"), (_SHELL_LINE, "shell")]
    if task in TASKS_WITH_BARE_CALLS:
        openers.append((_BARE_CALL, "bare_call"))
    regions, position = [], 0
    while position < len(text):
        found = None
        for rank, (pattern, name) in enumerate(openers):
            match = pattern.search(text, position)
            if match and (found is None or (match.start(), rank) < (found[0].start(), found[1])):
                found = (match, rank, name)
        if found is None:
            break
        match, _, name = found
        start = match.start()
        if name == "tag":
            close = text.find("</tool_call>", match.end())
            end, kind = (len(text) if close < 0 else close + len("</tool_call>")), "tool_call"
        elif name == "fence":
            fence, info = match.group(1), match.group(2).strip().split(" ")[0].lower()
            closer = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M)
            close = closer.search(text, match.end() + 1) if match.end() < len(text) else None
            end = close.end() if close else len(text)
            kind = "tool_call" if info in JSON_INFO else "code"
        elif name in ("call_list", "json"):
            bracket = start + len(match.group(0)) - len(match.group(0).lstrip())
            end, kind = _balanced_end(text, bracket), "tool_call"
        elif name == "bare_call":
            end, kind = match.end(), "tool_call"
        else:  # shell
            end, kind = match.end(), "code"
        end = max(end, match.end(), start + 1)
        regions.append((start, end, kind))
        position = end
    return regions


def char_kinds(text: str, task: str = "") -> list[str]:
    """The kind of every character of a reply's text (module docstring; docs/spans.md)."""
    kinds: list[str | None] = [None] * len(text)
    for start, end, kind in _regions(text, task):
        kinds[start:end] = [kind] * (end - start)
    # the rest, line by line: prose when the line (outside regions) has a word of two letters or more, else other
    position = 0
    while position < len(text):
        end = _line_end(text, position)
        free = [i for i in range(position, end) if kinds[i] is None]
        if free:
            segment = "".join(text[i] for i in free)
            if segment.strip():
                kind = "prose" if _WORD.search(segment) else "other"
                for i in free:
                    kinds[i] = kind
        position = end
    # whitespace left over (blank lines, gaps between regions): the kind of the text before it
    previous = None
    for i, kind in enumerate(kinds):
        if kind is None:
            kinds[i] = previous
        else:
            previous = kind
    following = next((k for k in kinds if k is not None), "other")
    return [k if k is not None else following for k in kinds]


def token_kinds(text: str, starts: list[int], ends: list[int], ids: list[int], special_ids: Iterable[int] = (),
                task: str = "") -> list[str]:
    """Each token's kind: the kind of most of its characters (ties: its first character); a token with no
    characters of its own (part of a multi-byte character) takes the character it helps form; special tokens
    (end of turn, …) are `other`."""
    chars = char_kinds(text, task)
    special = set(special_ids)
    found = []
    for token, start, end in zip(ids, starts, ends):
        if token in special or not chars:
            found.append("other")
            continue
        if end <= start:
            found.append(chars[min(start, len(chars) - 1)])
            continue
        counts: dict[str, int] = {}
        for kind in chars[start:end]:
            counts[kind] = counts.get(kind, 0) + 1
        best = max(counts.values())
        found.append(next(k for k in chars[start:end] if counts[k] == best))
    return found


# ---- copy lengths ------------------------------------------------------------------------------------------------
def copy_lengths(context_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    """(copy_len, context_copy_len) per output position: the longest run of tokens ending there that occurs
    earlier in context + output, and the longest that occurs inside the context. Online suffix automaton: each
    state keeps its longest length, suffix link and first end position; after token j is added, the link of the
    new state holds the longest suffix of the sequence that occurred before j."""
    length, link, first, trans = [0], [-1], [-1], [{}]
    last, n_context = 0, len(context_ids)
    copied, from_context = [], []
    for j, token in enumerate([*context_ids, *output_ids]):
        cur = len(length)
        length.append(length[last] + 1)
        link.append(0)
        first.append(j)
        trans.append({})
        p = last
        while p != -1 and token not in trans[p]:
            trans[p][token] = cur
            p = link[p]
        if p != -1:
            q = trans[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                length.append(length[p] + 1)
                link.append(link[q])
                first.append(first[q])
                trans.append(dict(trans[q]))
                while p != -1 and trans[p].get(token) == q:
                    trans[p][token] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        last = cur
        if j >= n_context:
            state = link[cur]
            copied.append(length[state])
            while state > 0 and first[state] >= n_context:  # its first occurrence ends in the output
                state = link[state]
            from_context.append(length[state])
    return copied, from_context


# ---- one turn ----------------------------------------------------------------------------------------------------
@dataclass
class SpanRecord:
    """The labels of one decoded turn (one row of spans.parquet)."""

    run_id: str
    method: str
    task: str
    sample_id: str
    turn: int
    context_len: int  # tokens of the context the labels were computed against
    context_sha256: str  # of the context ids (`ids_hash`), so a rebuilt context can be checked against the run's
    n_tokens: int  # = len(output_ids) of the turn
    kind: list[str] = field(default_factory=list)  # per output position: tool_call | code | prose | other
    copy_len: list[int] = field(default_factory=list)  # longest match ending here in context + earlier output
    context_copy_len: list[int] = field(default_factory=list)  # the same, occurrences inside the context only
    threshold: int = DEFAULT_THRESHOLD  # a position is copied when copy_len >= threshold
    labeller_version: str = LABELLER_VERSION
    skip_reason: str = ""  # why the turn has no labels (its context could not be rebuilt), "" when labelled

    @property
    def copied(self) -> list[bool]:
        return [n >= self.threshold for n in self.copy_len]


def ids_hash(ids: Iterable[int]) -> str:
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()[:16]


def label_turn(output_ids, context_ids, tokenizer: Tokenizer, *, task: str, method: str, sample_id: str, turn: int,
               run_id: str = "", threshold: int = DEFAULT_THRESHOLD) -> SpanRecord:
    """Labels of one decoded turn from what the runner holds in memory (context ids, output ids, its tokenizer);
    `label_run` calls it too, with the context rebuilt from run.json, so both give the same row."""
    output_ids = [int(i) for i in output_ids]
    context_ids = [int(i) for i in context_ids]
    text, starts, ends = token_char_spans(lambda ids: tokenizer.decode(ids, skip_special_tokens=False), output_ids)
    kinds = token_kinds(text, starts, ends, output_ids, getattr(tokenizer, "all_special_ids", ()) or (), task)
    copied, from_context = copy_lengths(context_ids, output_ids)
    return SpanRecord(run_id=run_id, method=method, task=task, sample_id=sample_id, turn=int(turn),
                      context_len=len(context_ids), context_sha256=ids_hash(context_ids), n_tokens=len(output_ids),
                      kind=kinds, copy_len=copied, context_copy_len=from_context, threshold=int(threshold))


def skipped_turn(*, task: str, method: str, sample_id: str, turn: int, reason: str, run_id: str = "",
                 threshold: int = DEFAULT_THRESHOLD, n_tokens: int = 0, context_len: int = 0) -> SpanRecord:
    """A decoded turn that could not be labelled, with the reason (a recorded skip, never a silent gap)."""
    return SpanRecord(run_id=run_id, method=method, task=task, sample_id=sample_id, turn=int(turn),
                      context_len=context_len, context_sha256="", n_tokens=n_tokens, threshold=int(threshold),
                      skip_reason=reason)


# ---- the table ---------------------------------------------------------------------------------------------------
SPANS_TABLE = "spans"  # spans.parquet/ in the run directory, read and written by evalsuite.store.run_store
SPANS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("method", pa.string()), ("task", pa.string()), ("sample_id", pa.string()),
    ("turn", pa.int64()), ("context_len", pa.int64()), ("context_sha256", pa.string()), ("n_tokens", pa.int64()),
    ("kind", pa.list_(pa.string())), ("copy_len", pa.list_(pa.int32())), ("context_copy_len", pa.list_(pa.int32())),
    ("threshold", pa.int64()), ("labeller_version", pa.string()), ("skip_reason", pa.string()),
])
ROW_KEY = ["method", "sample_id", "turn", "labeller_version"]  # one row per decoded turn and labeller version


def span_rows(records: Iterable[SpanRecord]) -> list[dict]:
    """The records as rows of SPANS_SCHEMA (what `RunStore.write_turn(extra=…)` takes)."""
    return [asdict(r) for r in records]


def of_version(spans, version: str = LABELLER_VERSION):
    """The rows of one labeller version (a frame of the spans table, as `store.read_table` returns it); rows of other
    versions stay in the run, unread."""
    return spans[spans.labeller_version == version].reset_index(drop=True)
