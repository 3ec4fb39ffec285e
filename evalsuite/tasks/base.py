"""Task adapters turn benchmark data into trajectories of turns; this module holds the types and the registry.

A *turn* is what happens before the model speaks once: the messages added to the conversation (user
prompts, tool observations) plus, where the data has one, the logged assistant reply. A *trajectory* is
the ordered list of turns of one sample. Raw-token samples (`prompt_ids`) skip the chat template.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from evalsuite.bundled import bundled_path, require_bundled
from evalsuite.catalog import suggest
from evalsuite.errors import UserError

DATA_DIR = bundled_path("tasks")  # the top-level tasks/: one folder per task (its data, README, task.toml)


@dataclass
class Turn:
    new_messages: list[dict]  # appended to the history before the model speaks
    logged_reply: dict | None = None  # the logged assistant message, for `--replay logged`
    prompt_ids: list[int] | None = None  # raw token ids: sent to the target as they are, no chat template
    # a one-turn sample's long document: the last new message's content before this character may be cut to a
    # prefix (the rest, e.g. the question, is kept), so that --context-points decodes it at each point
    cut_at: int | None = None


@dataclass
class Trajectory:
    sample_id: str
    turns: list[Turn]
    tools: list[dict] | None = None  # function schemas rendered through the chat template's tool support
    meta: dict = field(default_factory=dict)

    @property
    def has_logged_replies(self) -> bool:
        return any(t.logged_reply is not None for t in self.turns)


@dataclass(frozen=True)
class LoadOptions:
    limit: int | None = None
    seed: int = 0
    data_path: str | None = None
    subset: str | None = None
    format: str | None = None  # --format: the trajectory format of --data-path (None: detected); swebench only


@dataclass(frozen=True)
class TaskInfo:
    name: str
    load: Callable[[LoadOptions], list[Trajectory]]
    summary: str
    default_replay: str  # "free" or "logged"
    licence: str
    source: str
    subsets: tuple[str, ...] = ()  # what --subset accepts (for messages); empty: the task has none
    formats: bool = False  # whether --format (a trajectory format for --data-path) applies
    turns: str = ""  # the turn structure, in words (from the task's description)
    scoring: str = ""  # the task's own metric, and whether evalsuite computes it
    description: object | None = None  # the TaskDescription it was registered from (evalsuite/tasks/description.py)


TASKS: dict[str, TaskInfo] = {}


def register_task(name, summary: str | None = None, licence: str | None = None, source: str | None = None,
                  default_replay: str = "free", subsets: tuple[str, ...] = (), bundled: bool = True,
                  formats: bool = False):
    """Register an adapter, from its task's description (`register_task(describe("gsm8k"))`, the fields of
    tasks/<folder>/task.toml; evalsuite/tasks/description.py) or from the fields themselves (a plug-in without a
    description). `subsets`: what --subset accepts (the adapter checks the names); `bundled`: whether the task
    reads tasks/ when no --data-path is given; `formats`: whether it reads --format. Before the adapter runs, a
    --subset for a task without subsets is refused, so is a --format for a task without formats, and so is a run
    on bundled data when this install has none."""
    description = None
    if not isinstance(name, str):
        description = name
        name, summary, licence, source = description.name, description.summary, description.licence, description.source
        default_replay, bundled, formats = description.default_replay, description.bundled, description.formats
        subsets = description.subset_names
    elif summary is None or licence is None or source is None:
        raise TypeError(f"register_task({name!r}): give the task's description, or summary, licence and source")

    def wrap(load: Callable[[LoadOptions], list[Trajectory]]):
        def checked_load(options: LoadOptions) -> list[Trajectory]:
            if options.subset is not None and not subsets:
                raise UserError(f"--subset {options.subset}: task {name} has no subsets; drop --subset")
            if options.format not in (None, "auto") and not formats:
                raise UserError(f"--format {options.format}: task {name} reads one format; --format is for "
                                "--task swebench trajectories")
            if options.data_path is None and bundled:
                require_bundled("tasks", f"the bundled data of task {name}", "pass --data-path")
                if description is not None and description.missing:
                    raise UserError(f"task {name}: its description {description.path} is missing from this "
                                    "install; reinstall evalsuite with its bundled data, or pass --data-path")
            return load(options)

        TASKS[name] = TaskInfo(name, checked_load, summary, default_replay, licence, source, tuple(subsets), formats,
                               getattr(description, "turns", ""), getattr(description, "scoring", ""), description)
        return load

    return wrap


def get_task(name: str) -> TaskInfo:
    import evalsuite.tasks  # noqa: F401  (registers every adapter)

    if name not in TASKS:
        raise UserError(f"unknown task '{name}'{suggest(name, TASKS)}; choose from: {', '.join(sorted(TASKS))}")
    return TASKS[name]


def replay_source(trajectories: list[Trajectory], replay: str) -> str:
    """Where the replies in each turn's context come from, in words (run.json's `replay_source`): under `logged`, the
    authors named by the trajectories' `meta["logged_by"]` or `meta["model"]` (e.g. "logged replies of
    google/gemini-3-pro-preview (mini-swe-agent)"), else "logged replies from the task data"; under `closed`, the
    executed loop; otherwise the method's own replies."""
    if not any(len(t.turns) > 1 for t in trajectories):
        return "single-turn samples: no earlier replies in any context"
    if replay == "closed":
        return "closed loop: the model's own calls, executed, and their results"
    if replay != "logged":
        return "each method's own earlier replies"

    def author(t: Trajectory) -> str | None:
        if t.meta.get("logged_by"):
            return str(t.meta["logged_by"])
        if t.meta.get("model"):
            return f"{t.meta['model']} ({t.meta['format']})" if t.meta.get("format") else str(t.meta["model"])
        return None

    logged = [t for t in trajectories if t.has_logged_replies]
    authors = list(dict.fromkeys(a for a in map(author, logged) if a))
    text = "logged replies of " + "; ".join(authors) if authors else "logged replies from the task data"
    if authors and any(author(t) is None for t in logged):
        text += " (and of unnamed authors in some samples)"
    if any(not t.has_logged_replies and len(t.turns) > 1 for t in trajectories):
        text += "; samples without logged replies continue with the method's own"
    return text


def seeded_subset(items: list, limit: int | None, seed: int) -> list:
    """Deterministic subset: shuffle a copy with random.Random(seed) (as the DLite/z-lab scripts do), take `limit`."""
    if limit is None or limit >= len(items):
        return list(items)
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    return shuffled[:limit]


def select_samples(trajectories: list[Trajectory], sample_ids: list[str], task: str) -> list[Trajectory]:
    """The trajectories with these ids, in the order given (`--sample-ids`); an unknown id is a UserError."""
    by_id = {t.sample_id: t for t in trajectories}
    unknown = [i for i in sample_ids if i not in by_id]
    if unknown:
        examples = ", ".join(list(by_id)[:3])
        raise UserError(f"--sample-ids: {', '.join(unknown)} not in task {task} ({len(by_id)} samples, "
                        f"e.g. {examples})")
    return [by_id[i] for i in sample_ids]


def user_turn(text: str) -> Turn:
    return Turn(new_messages=[{"role": "user", "content": text}])


def read_jsonl(path: Path) -> Iterable[tuple[int, dict]]:
    """Yield (line number, record); a bad line is a one-line UserError naming the file and line."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from err
    return iter_jsonl_bytes(path, raw)


def iter_jsonl_bytes(path: Path, raw: bytes) -> Iterable[tuple[int, dict]]:
    """JSON Lines already in memory (e.g. decompressed); `path` names the file in errors."""
    import json

    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise UserError(f"{path}:{lineno}: not valid UTF-8 ({err.reason})") from err
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
