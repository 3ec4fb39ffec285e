"""Typed records and the append-only run store.

A run directory holds:
- `steps.parquet/`  one row per verify step (a directory of Parquet parts; `pandas.read_parquet` reads it whole)
- `turns.parquet/`  one row per (method, sample, turn)
- `run.json`        configuration and environment

Each finished (method, sample) trajectory is written as one part file per table, named by a hash of
(method, sample_id), so rows are never duplicated. Each part is written under a hidden temporary name
(`.<key>.parquet.tmp`, which Parquet readers skip) and renamed into place. The turns part is written last:
it marks the pair finished. A finished pair is never written again (`--resume` decodes only unfinished
pairs), so its parts stay byte-identical. A steps part without its turns part (the process was killed
between the two renames) is an *orphan*: the readers here ignore it and `RunStore.clean` removes it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from evalsuite.config import portable_paths
from evalsuite.errors import UserError


@dataclass
class StepRecord:
    run_id: str
    method: str
    task: str
    sample_id: str
    turn: int
    step: int
    context_len: int  # KV length when the step starts (tokens the target has already processed)
    num_drafted: int
    num_accepted: int  # accepted drafts, bonus excluded; drafts after an accepted EOS draft are not counted
    accept_flags: list[bool]  # per drafted position: did the target accept it (False after the first rejection)
    emitted: int  # tokens this step added to the output (accepted + bonus, less any cut at EOS/limit)
    draft_s: float  # drafter work: propose + commit
    verify_s: float  # the target's verify forward
    step_s: float  # whole step: draft + verify + acceptance, KV rollback and bookkeeping
    draft_state_bytes: int  # draft-side memory after the step: history + working
    draft_history_bytes: int  # the part of it that grows with the context
    engine: str = "hf"  # "hf" (ours) | "vllm"; vLLM rows leave the timing and memory fields null
    budget_limited: bool = False  # the token budget or the window left no room to draft; excluded from τ


@dataclass
class TurnRecord:
    run_id: str
    method: str
    task: str
    sample_id: str
    turn: int
    replay: str  # "logged" | "free" | "mixed" | "raw": where the replies in this turn's context came from
    context_len: int  # tokens before the model speaks (the rendered prompt of this turn)
    prompt_tokens: int  # = context_len; kept under the name the README and issue use
    prefill_tokens: int  # tokens the target actually prefilled (the rest came from the shared prefix cache)
    new_tokens: int
    num_steps: int
    prefill_s: float
    draft_prefill_s: float  # drafter start-of-turn work (e.g. building its KV over the context)
    decode_s: float  # after prefill: first verify step to the last token
    tau: float  # pooled ratio over this turn's verify steps, bonus included: sum(accepted + 1) / steps (steps
    # that were budget_limited excluded; NaN when no step could draft)
    ar_decode_s: float  # the paired AR decode of the same turn
    ar_new_tokens: int
    speedup_turn: float  # this turn alone: (ar_decode_s / ar_new_tokens) / (decode_s / new_tokens); the speedup
    # the report gives is pooled over turns (sums of seconds and tokens), not a mean of these
    stop_reason: str  # eos | max_new_tokens | context_limit | skipped
    skip_reason: str  # why the turn was not decoded, "" when it was
    dropped_tokens: int  # tokens cut from the left under --context-policy truncate-left
    dropped_messages: int = 0  # whole oldest messages dropped under --context-policy truncate-left (0 for raw ids)
    position: int = 0  # where this method ran in the turn's seed-shuffled order of methods (0 = first; ar included)
    output_ids: list[int] = field(default_factory=list)
    worker_host: str = ""  # the host that decoded this turn (every method of a turn runs on one worker)
    worker_device: str = ""  # its device: cpu, or cuda:N with N the physical GPU
    engine: str = "hf"  # "hf" (ours) | "vllm"


def _schema(cls) -> pa.Schema:
    kinds = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_(),
             "int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_(),
             "list[bool]": pa.list_(pa.bool_()), "list[int]": pa.list_(pa.int64())}
    return pa.schema([(f.name, kinds[f.type]) for f in fields(cls)])


STEP_SCHEMA = _schema(StepRecord)
TURN_SCHEMA = _schema(TurnRecord)


def pair_key(method: str, sample_id: str) -> str:
    return hashlib.sha1(f"{method}\0{sample_id}".encode()).hexdigest()[:16]


class RunStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.steps_dir = self.root / "steps.parquet"
        self.turns_dir = self.root / "turns.parquet"

    def prepare(self) -> None:
        try:
            self.steps_dir.mkdir(parents=True, exist_ok=True)
            self.turns_dir.mkdir(parents=True, exist_ok=True)
            probe = self.root / ".write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as err:
            raise UserError(f"--out {self.root}: not writable ({err.strerror}); choose another directory") from err

    def finished_pairs(self) -> set[str]:
        """Keys (`pair_key`) of the finished (method, sample) pairs."""
        return finished_keys(self.root)

    def is_finished(self, method: str, sample_id: str) -> bool:
        return (self.turns_dir / f"{pair_key(method, sample_id)}.parquet").exists()

    def write_trajectory(self, method: str, sample_id: str, steps: list[StepRecord], turns: list[TurnRecord]) -> None:
        """Write one finished pair. Refuses to rewrite a finished one: its parts must stay as they are."""
        if self.is_finished(method, sample_id):
            raise RuntimeError(f"({method}, {sample_id}) is already finished in {self.root}; not rewriting it")
        key = pair_key(method, sample_id)
        _atomic_parquet(self.steps_dir / f"{key}.parquet", steps, STEP_SCHEMA)
        _atomic_parquet(self.turns_dir / f"{key}.parquet", turns, TURN_SCHEMA)  # last: marks the pair done

    def leftovers(self) -> list[Path]:
        """What an interrupted writer left: orphaned steps parts and temporary files."""
        finished = self.finished_pairs()
        found = [p for p in _parts(self.steps_dir) if p.stem not in finished]
        for directory in (self.steps_dir, self.turns_dir):
            if directory.is_dir():
                found += sorted(directory.glob(".*.parquet.tmp"))
        return found

    def clean(self) -> list[Path]:
        """Remove the leftovers of an interrupted run (call before decoding, never while a writer is active)."""
        removed = self.leftovers()
        for path in removed:
            path.unlink(missing_ok=True)
        return removed

    def write_config(self, config: dict) -> None:
        path = self.root / "run.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(portable_paths(config), indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)

    def read_config(self) -> dict | None:
        path = self.root / "run.json"
        return json.loads(path.read_text()) if path.exists() else None


def _atomic_parquet(path: Path, records: list, schema: pa.Schema) -> None:
    table = pa.Table.from_pylist([asdict(r) for r in records], schema=schema)
    tmp = path.with_name(f".{path.name}.tmp")  # hidden: pyarrow's dataset discovery skips it
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _parts(directory: Path) -> list[Path]:
    return sorted(directory.glob("[!.]*.parquet")) if directory.is_dir() else []


def finished_keys(run_dir: str | Path) -> set[str]:
    return {p.stem for p in _parts(Path(run_dir) / "turns.parquet")}


def load_steps(run_dir: str | Path) -> pd.DataFrame:
    """Steps of the finished pairs only (an orphaned part, whose turns part never landed, is ignored)."""
    finished = finished_keys(run_dir)
    parts = [p for p in _parts(Path(run_dir) / "steps.parquet") if p.stem in finished]
    return _load(parts, STEP_SCHEMA)


def load_turns(run_dir: str | Path) -> pd.DataFrame:
    return _load(_parts(Path(run_dir) / "turns.parquet"), TURN_SCHEMA)


def _load(parts: list[Path], schema: pa.Schema) -> pd.DataFrame:
    if not parts:
        return schema.empty_table().to_pandas()
    frame = pa.concat_tables([pq.read_table(p, schema=schema) for p in parts]).to_pandas()
    frame["engine"] = frame["engine"].fillna("hf")  # records written before the column existed are ours
    return frame
