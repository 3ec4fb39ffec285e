"""The append-only run store: its writer (`RunStore`) and its one reader (`read_run`), used by the runner, resume,
`evalsuite compare`, the summary and the report. No torch.

A run directory holds:
- `run.json`        configuration and environment
- `turns.parquet/`  one row per (method, sample, turn), decoded or skipped (a directory of Parquet parts)
- `steps.parquet/`  one row per verify step
- other tables of the same layout (e.g. `spans.parquet/`) keyed the same way

Every turn of a trajectory is persisted as soon as all its methods have decoded it: one part per table, named by a
hash of (sample, turn, methods), written under a hidden temporary name and renamed into place, the turns part last
(it marks the group done). A group is never rewritten. A part of another table without its turns part (the process
was killed between the renames) is an *orphan*: the reader ignores it and `RunStore.clean` removes it.
`RunStore.compact` merges a finished run's parts into one file per table; the reader drops any row it sees twice
(an interrupted compaction leaves both copies), so every reader sees the same rows whatever the layout.
Runs written before per-turn parts (one part per finished (method, sample) pair) read the same way.
A tool that adds rows to a stored run afterwards (`evalsuite label`: spans) writes parts named `added-<hash>`, which
belong to no turn group: the reader reads them whole (their rows are of turns already stored), `clean` keeps them,
and `compact` merges them in.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from evalsuite.config import portable_paths
from evalsuite.errors import UserError
from evalsuite.spans import ROW_KEY as SPANS_ROW_KEY
from evalsuite.spans import SPANS_TABLE
from evalsuite.store.records import STEP_SCHEMA, TURN_SCHEMA, StepRecord, TurnRecord

TURNS, STEPS = "turns", "steps"
SCHEMAS = {TURNS: TURN_SCHEMA, STEPS: STEP_SCHEMA}
ROW_KEYS = {TURNS: ["method", "sample_id", "turn"], STEPS: ["method", "sample_id", "turn", "step"],
            SPANS_TABLE: SPANS_ROW_KEY}
COMPACT_PREFIX = "compact-"
ADDED_PREFIX = "added-"  # parts added to a stored run after its turns (no turn group of their own)

# Columns every reader computes from: a run without one of them cannot be read. Any other column of the schema
# that an older run lacks is filled (FILL_MISSING, else NaN); columns added by later versions are kept as they are.
REQUIRED_COLUMNS = {"method", "task", "sample_id", "turn", "context_len", "num_drafted", "num_accepted",
                    "accept_flags", "draft_s", "verify_s", "new_tokens", "decode_s", "ar_decode_s", "ar_new_tokens",
                    "stop_reason"}
FILL_MISSING = {"draft_state_bytes": 0, "draft_history_bytes": 0, "dropped_tokens": 0, "dropped_messages": 0,
                "skip_reason": "", "output_ids": None, "engine": "hf", "budget_limited": False, "position": 0,
                "worker_host": "", "worker_device": "", "contended": False, "repo": "", "pairing": "",
                "context_point": 0,
                "degenerate_reason": "", "repeat_decode_s": None}
# (`degenerate` is left NaN in older runs: not computed, which is not "not degenerate"; the report computes it.)


def group_key(sample_id: str, turn: int, methods: list[str]) -> str:
    return hashlib.sha1(f"{sample_id}\0{turn}\0{','.join(sorted(methods))}".encode()).hexdigest()[:16]


@dataclass
class RunTables:
    """What `read_run` returns: run.json (None when absent) and the rows of every finished turn."""

    root: Path
    config: dict | None
    steps: pd.DataFrame
    turns: pd.DataFrame

    def done_turns(self) -> dict[tuple[str, str], pd.DataFrame]:
        """(method, sample_id) → its stored turn rows, in turn order."""
        return {key: rows.sort_values("turn") for key, rows in self.turns.groupby(["method", "sample_id"], sort=False)}

    def finished_pairs(self) -> set[tuple[str, str]]:
        """(method, sample_id) pairs whose last turn is stored."""
        last = self.turns[self.turns["last"].astype(bool)]
        return set(zip(last.method, last.sample_id))


class RunStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._stored: set[tuple[str, str, int]] | None = None  # (method, sample, turn) rows held, read on first write

    def table_dir(self, table: str) -> Path:
        return self.root / f"{table}.parquet"

    def prepare(self) -> None:
        try:
            for table in SCHEMAS:
                self.table_dir(table).mkdir(parents=True, exist_ok=True)
            # A probe of its own: workers preparing one store at once must not delete each other's probe.
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".write-test-"):
                pass
        except OSError as err:
            raise UserError(f"--out {self.root}: not writable ({err.strerror}); choose another directory") from err

    def write_turn(self, sample_id: str, turn: int, steps: list[StepRecord], turns: list[TurnRecord],
                   extra: dict[str, tuple[list[dict], pa.Schema]] | None = None) -> None:
        """Persist one turn of one trajectory: the rows of every method decoded (or skipped) in it. Other tables'
        parts (`extra`: name → (rows, schema)) land before the turns part, which marks the group done."""
        methods = sorted({r.method for r in turns})
        if self._stored is None:
            held = read_table(self.root, TURNS, TURN_SCHEMA)
            self._stored = set(zip(held.method, held.sample_id, held.turn))
        again = sorted(m for m in methods if (m, sample_id, turn) in self._stored)
        if again:
            raise RuntimeError(f"turn {turn} of {sample_id} ({', '.join(again)}) is already stored in {self.root}")
        key = group_key(sample_id, turn, methods)
        for name, (rows, schema) in (extra or {}).items():
            self.table_dir(name).mkdir(parents=True, exist_ok=True)
            _atomic_parquet(self.table_dir(name) / f"{key}.parquet", rows, schema)
        _atomic_parquet(self.table_dir(STEPS) / f"{key}.parquet", [asdict(r) for r in steps], STEP_SCHEMA)
        _atomic_parquet(self.table_dir(TURNS) / f"{key}.parquet", [asdict(r) for r in turns], TURN_SCHEMA)
        self._stored |= {(m, sample_id, turn) for m in methods}

    def leftovers(self) -> list[Path]:
        """What an interrupted writer left: parts without their turns part, and temporary files."""
        done = {p.stem for p in _parts(self.table_dir(TURNS))}
        found = []
        for directory in sorted(self.root.glob("*.parquet")):
            if directory.is_dir():
                if directory.name != f"{TURNS}.parquet":
                    found += [p for p in _parts(directory) if p.stem not in done and not _added(p)]
                found += sorted(directory.glob(".*.parquet.tmp"))
        return found

    def clean(self) -> list[Path]:
        """Remove the leftovers of an interrupted run (call before decoding, never while a writer is active)."""
        removed = self.leftovers()
        for path in removed:
            path.unlink(missing_ok=True)
        return removed

    def compact(self) -> int:
        """Merge the finished parts of every table into one file per table (rows unchanged); returns the number of
        parts merged away. Only for a run no writer is using."""
        self.clean()
        done = sorted(p.stem for p in _parts(self.table_dir(TURNS)))
        added = [p for d in self.root.glob("*.parquet") for p in _parts(d) if _added(p)]
        if len(done) <= 1 and not (done and added):
            return 0
        name = COMPACT_PREFIX + hashlib.sha1("\0".join(done).encode()).hexdigest()[:16]
        tables = [d.name.removesuffix(".parquet") for d in sorted(self.root.glob("*.parquet")) if d.is_dir()]
        tables = [t for t in tables if t != TURNS] + [TURNS]  # the turns file last, as in write_turn
        for table in tables:
            frame = read_table(self.root, table, SCHEMAS.get(table), done=set(done))
            arrow = pa.Table.from_pandas(frame, preserve_index=False)
            tmp = self.table_dir(table) / f".{name}.parquet.tmp"
            pq.write_table(arrow, tmp)
            os.replace(tmp, self.table_dir(table) / f"{name}.parquet")
        for table in tables:
            for part in _parts(self.table_dir(table)):
                if part.stem != name:
                    part.unlink()
        return len(done) + len(added)

    def write_config(self, config: dict) -> None:
        path = self.root / "run.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(portable_paths(config), indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)

    def read_config(self) -> dict | None:
        return read_config(self.root)


def read_config(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise UserError(f"{path}: not valid JSON ({err}); rerun `evalsuite run` into a new --out") from err


def read_run(run_dir: str | Path) -> RunTables:
    """The one reader: run.json and the rows of every finished turn (orphaned parts ignored, missing columns of
    older runs filled, rows seen twice dropped)."""
    root = Path(run_dir)
    for attempt in range(5):  # a writer running beside the reader may compact or clean parts between list and read
        done = {p.stem for p in _parts(root / f"{TURNS}.parquet")}
        try:
            turns = read_table(root, TURNS, TURN_SCHEMA, done)
            steps = read_table(root, STEPS, STEP_SCHEMA, done)
            break
        except FileNotFoundError:
            if attempt == 4:
                raise
    if "last" not in turns.columns or turns["last"].isna().all():
        # before per-turn parts, a (method, sample) was stored only when finished: its newest turn is its last
        newest = turns.groupby(["method", "sample_id"]).turn.transform("max") if len(turns) else turns.turn
        turns["last"] = turns.turn == newest
    turns["last"] = turns["last"].fillna(False).astype(bool)
    return RunTables(root, read_config(root), steps, turns)


def read_table(root: Path, table: str, schema: pa.Schema | None = None, done: set[str] | None = None
               ) -> pd.DataFrame:
    """Every finished part of one table (parts whose group has a turns part, and parts added afterwards), as one
    frame."""
    directory = Path(root) / f"{table}.parquet"
    if done is None:
        done = {p.stem for p in _parts(Path(root) / f"{TURNS}.parquet")}
    parts = [p for p in _parts(directory) if p.stem in done or _added(p)]
    frames = [pq.read_table(p).to_pandas() for p in parts]
    frames = [f for f in frames if len(f.columns)]
    if frames:
        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    else:
        frame = schema.empty_table().to_pandas() if schema is not None else pd.DataFrame()
    for name in (schema.names if schema is not None else []):
        if name not in frame.columns:
            if name in REQUIRED_COLUMNS and len(frame):
                raise UserError(f"{directory}: column {name!r} is missing; this run was written by an incompatible "
                                "evalsuite version, rerun it")
            frame[name] = FILL_MISSING.get(name, float("nan"))
    for name, value in FILL_MISSING.items():
        if name in frame.columns and value is not None and len(frame):
            frame[name] = frame[name].fillna(value)
    keys = [k for k in ROW_KEYS.get(table, ROW_KEYS[TURNS]) if k in frame.columns]
    if len(frame) and keys:
        frame = frame.drop_duplicates(keys).reset_index(drop=True)
    return frame


def _atomic_parquet(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    table = pa.Table.from_pylist(rows, schema=schema)
    tmp = path.with_name(f".{path.name}.tmp")  # hidden: pyarrow's dataset discovery skips it
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def write_added(root: Path, table: str, key: str, rows: list[dict], schema: pa.Schema) -> Path:
    """Add rows of turns already stored to a table of a run (e.g. `evalsuite label`'s spans), as one part named by
    `key` that no turn group can take; a part of that name is never rewritten (FileExistsError)."""
    path = Path(root) / f"{table}.parquet" / f"{ADDED_PREFIX}{key}.parquet"
    if path.exists():
        raise FileExistsError(f"{path} exists; added parts are never rewritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_parquet(path, rows, schema)
    return path


def _added(part: Path) -> bool:
    return part.stem.startswith(ADDED_PREFIX)


def _parts(directory: Path) -> list[Path]:
    return sorted(directory.glob("[!.]*.parquet")) if directory.is_dir() else []
