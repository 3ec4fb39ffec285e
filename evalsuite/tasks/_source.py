"""Where a task's records come from: the bundled copy in `tasks/`, a local `--data-path`, or the Hugging Face hub.

`--data-path` semantics, shared by every adapter:
- not given: the bundled copy under `tasks/<name>/`;
- an existing file or directory: a full local copy in the task's native format;
- `hub`, or an `owner/name` id that is not a local path: loaded with `datasets.load_dataset` (the reference HF id
  for `hub`). When the hub cannot be reached the run stops with a one-line message that says how to get the data.

Records come back as `(where, row)` pairs; `where` ("file:line" or "file[index]") names the record in every
error message, so a malformed record is reported as a one-line `UserError`, never a traceback.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlparse

from evalsuite.errors import UserError
from evalsuite.tasks.base import LoadOptions, Trajectory, iter_jsonl_bytes, register_task, seeded_subset, user_turn
from evalsuite.tasks.description import describe

HUB = "hub"  # `--data-path hub`: the task's reference Hugging Face id
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")

Record = tuple[str, dict]


@dataclass(frozen=True)
class HubSpec:
    """Arguments for `datasets.load_dataset`, as the reference scripts pass them."""

    path: str
    name: str | None = None
    split: str | None = None
    data_files: Any = None
    label: str | None = None  # the dataset's name in messages when `path` is a builder such as "json"
    extra: dict = field(default_factory=dict)

    def describe(self) -> str:
        parts = [self.label or self.path] + [p for p in (self.name, self.split) if p]
        return "/".join(parts)


def wants_hub(data_path: str | None) -> bool:
    if data_path is None:
        return False
    if data_path == HUB:
        return True
    return not Path(data_path).expanduser().exists() and bool(_HUB_ID.fullmatch(data_path))


def local_path(data_path: str) -> Path:
    path = Path(data_path).expanduser()
    if not path.exists():
        raise UserError(f"--data-path {data_path}: no such file or directory (or pass `hub` for the reference HF copy)")
    return path


def hub_reachable(timeout: float = 3.0) -> bool:
    """A fast probe, so that an offline run fails in seconds instead of after the hub client's retries."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return True  # offline mode reads the local HF cache; let `datasets` answer
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy may reach what a direct connection cannot
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def offline_message(task: str, hub_id: str) -> str:
    return (f"task {task}: the Hugging Face hub is not reachable, so {hub_id} cannot be loaded; on a networked machine "
            f"download it (datasets.load_dataset or `huggingface-cli download --repo-type dataset {hub_id}`), "
            f"then pass --data-path <that copy> (or set HF_HUB_OFFLINE=1 to use a cached copy)")


def hub_rows(task: str, spec: HubSpec) -> list[Record]:
    if not hub_reachable():
        raise UserError(offline_message(task, spec.label or spec.path))
    try:
        import datasets

        kwargs = dict(spec.extra)
        if spec.data_files is not None:
            kwargs["data_files"] = spec.data_files
        loaded = datasets.load_dataset(spec.path, spec.name, split=spec.split, **kwargs)
    except Exception as err:  # the hub client raises many types (connection, auth, missing config)
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"task {task}: cannot load {spec.describe()} from the Hugging Face hub ({reason}); "
                        f"download it where the hub is reachable and pass --data-path") from err
    return [(f"{spec.describe()}[{i}]", dict(row)) for i, row in enumerate(loaded)]


def read_records(path: Path) -> list[Record]:
    """Records of a local file: JSON Lines (.jsonl, .jsonl.gz, or `.json` holding one object per line, as BFCL
    ships), a JSON array, or Parquet."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        return _read_parquet(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from err
    if name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise UserError(f"{path}: not a readable gzip file ({err})") from err
    return _records_from_bytes(path, raw)


def _records_from_bytes(path: Path, raw: bytes) -> list[Record]:
    if raw.lstrip()[:1] == b"[":
        data = _json_document(path, raw)
        return [(f"{path}[{i}]", _require_object(row, f"{path}[{i}]")) for i, row in enumerate(data)]
    return [(f"{path}:{lineno}", _require_object(row, f"{path}:{lineno}")) for lineno, row in iter_jsonl_bytes(path, raw)]


def read_json_document(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from err
    return _json_document(path, raw)


def _json_document(path: Path, raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not valid UTF-8 ({err.reason})") from err
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from err


def _read_parquet(path: Path) -> list[Record]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises ArrowInvalid, OSError, ... for a bad file
        raise UserError(f"{path}: not a readable Parquet file ({str(err).splitlines()[0]})") from err
    return [(f"{path}[{i}]", row) for i, row in enumerate(rows)]


def _require_object(row: Any, where: str) -> dict:
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def task_rows(task: str, options: LoadOptions, bundled: Path, hub: HubSpec) -> list[Record]:
    """The common case: the bundled file, a local file, or the reference hub copy."""
    if wants_hub(options.data_path):
        spec = hub if options.data_path == HUB else HubSpec(options.data_path, hub.name, hub.split)
        return hub_rows(task, spec)
    path = local_path(options.data_path) if options.data_path else bundled
    if path.is_dir():
        raise UserError(f"--data-path {path}: task {task} expects a file, not a directory")
    return read_records(path)


def text_field(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: record has no non-empty '{key}' string")
    return value


def prompted(rows: list[Record], field: str, template: str, sample_id) -> list[tuple[str, str]]:
    """(sample_id, prompt) per row: the row's `field` text put into `template` (a `{field}` placeholder);
    `sample_id(index, row)` names the sample."""
    return [(sample_id(index, row), template.format(**{field: text_field(row, field, where)}))
            for index, (where, row) in enumerate(rows)]


def prompt_task(name: str, field: str, template: str, hub: HubSpec, sample_id):
    """Register task `name` (described by tasks/<name>/task.toml) as one single-turn prompt per row: the row's
    `field` put into `template`, from the bundled file, a local one or `hub`; `sample_id(index, row)` names it.
    Returns the loader."""
    task = describe(name)

    @register_task(task)
    def load(options: LoadOptions) -> list[Trajectory]:
        rows = task_rows(name, options, task.data_file(), hub)
        return single_turn_trajectories(prompted(rows, field, template, sample_id), options)

    return load


def first_turn(row: dict, where: str, raw_field: str) -> str:
    """The prompt of a record in the DFlash/DLite evaluation format (`turns`: [prompt, …]); `raw_field` names the
    raw dataset's field that the record lacks, for the error message."""
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
        raise UserError(f"{where}: record needs '{raw_field}' (a raw row) or 'turns' [prompt]")
    return turns[0]


def single_turn_trajectories(items: Iterable[tuple[str, str]], options: LoadOptions,
                             meta: dict | None = None) -> list[Trajectory]:
    """(sample_id, prompt) pairs → one single-turn trajectory each, seeded subset applied."""
    chosen = seeded_subset(list(items), options.limit, options.seed)
    return [Trajectory(sample_id, [user_turn(prompt)], meta=dict(meta or {})) for sample_id, prompt in chosen]
