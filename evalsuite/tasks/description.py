"""A task's declarative description: `tasks/<folder>/task.toml` beside the task's bundled data and README.

The folder is the task's name with `-` written `_` (`mt-bench` → `tasks/mt_bench/`). The description holds what
is said about a task rather than computed: its name, summary, licence, source, default replay, the data files of
its default set and of each subset (paths relative to the folder), its turn structure and its own scoring. The
adapter in `evalsuite/tasks/` registers the task from it (`register_task(describe(name))`) and keeps only the
conversion code; `evalsuite tasks` lists the fields. The keys, with their defaults:

    name = "gsm8k"                      # the --task name
    summary = "..."                     # one line: what the samples are
    licence = "..."
    source = "..."                      # where the bundled copy and the hub copy come from
    default_replay = "free"             # free | logged
    bundled = true                      # whether the task reads its folder when no --data-path is given
    formats = false                     # whether --format applies (swebench)
    files = ["test.jsonl"]              # the default set's data files
    turns = "single turn"               # the turn structure, in words
    scoring = "..."                     # the task's own metric, and whether evalsuite computes it
    default_subset = "eagle"            # optional: the subset the default set is
    [[subsets]]                         # optional, in order: what --subset accepts
    name = "eagle"
    summary = "..."
    files = ["eagle_alpaca/question.jsonl"]   # empty for a subset read from the hub
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject installs tomli there)
    import tomli as tomllib

from evalsuite.errors import UserError
from evalsuite.tasks.base import DATA_DIR

REPLAYS = ("free", "logged")
KEYS = {"name", "summary", "licence", "source", "default_replay", "bundled", "formats", "files", "turns", "scoring",
        "default_subset", "subsets"}


@dataclass(frozen=True)
class Subset:
    name: str
    summary: str = ""
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskDescription:
    folder: Path
    name: str
    summary: str
    licence: str
    source: str
    default_replay: str = "free"
    bundled: bool = True
    formats: bool = False
    files: tuple[str, ...] = ()
    turns: str = ""
    scoring: str = ""
    default_subset: str | None = None
    subsets: tuple[Subset, ...] = field(default=())
    missing: bool = False  # the file was not there (an install without its bundled data): only the name is known

    @property
    def path(self) -> Path:
        return self.folder / "task.toml"

    @property
    def subset_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.subsets)

    def file(self, relative: str) -> Path:
        """A data file of this task, by its path relative to the task's folder."""
        return self.folder / relative

    def data_file(self, subset: str | None = None) -> Path:
        """The one data file of the default set, or of `subset` (the bare folder when the description is missing:
        only a --data-path run gets that far, and it does not read it)."""
        if self.missing:
            return self.folder
        files = self.subset(subset).files if subset is not None else self.files
        if len(files) != 1:
            raise ValueError(f"{self.path}: {subset or 'the default set'} has {len(files)} data files, not one")
        return self.file(files[0])

    def subset(self, name: str) -> Subset:
        for subset in self.subsets:
            if subset.name == name:
                return subset
        raise UserError(f"--subset {name}: {self.name} has subsets {', '.join(self.subset_names)}")

    def data_files(self) -> list[Path]:
        """Every data file the description names (the default set's, then each subset's), once each."""
        names = list(self.files) + [f for s in self.subsets for f in s.files]
        return [self.file(f) for f in dict.fromkeys(names)]


def folder_of(name: str) -> Path:
    return DATA_DIR / name.replace("-", "_")


def describe(name: str) -> TaskDescription:
    """The description of task `name`, read from `tasks/<folder>/task.toml`. A missing file (an install without
    its bundled data) gives a description that says so; a malformed one is an error (the file is ours)."""
    folder = folder_of(name)
    path = folder / "task.toml"
    if not path.is_file():
        note = f"(no description: {path} is missing)"
        return TaskDescription(folder, name, note, "unknown", "unknown", missing=True)
    with path.open("rb") as handle:
        raw = tomllib.load(handle)
    unknown = set(raw) - KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {', '.join(sorted(unknown))} (known: {', '.join(sorted(KEYS))})")
    if raw.get("name") != name:
        raise ValueError(f"{path}: name is {raw.get('name')!r}, the folder is that of task {name!r}")
    for key in ("summary", "licence", "source", "turns", "scoring"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ValueError(f"{path}: {key} must be a non-empty string")
    replay = raw.get("default_replay", "free")
    if replay not in REPLAYS:
        raise ValueError(f"{path}: default_replay {replay!r} is not one of {', '.join(REPLAYS)}")
    subsets = tuple(Subset(s["name"], s.get("summary", ""), tuple(s.get("files", ()))) for s in raw.get("subsets", ()))
    default_subset = raw.get("default_subset")
    if default_subset is not None and default_subset not in {s.name for s in subsets}:
        raise ValueError(f"{path}: default_subset {default_subset!r} is not one of its subsets")
    return TaskDescription(folder, name, raw["summary"], raw["licence"], raw["source"], replay,
                           bool(raw.get("bundled", True)), bool(raw.get("formats", False)),
                           tuple(raw.get("files", ())), raw["turns"], raw["scoring"], default_subset, subsets)
