"""SWE-bench instance rows and prompt sets: through the `swebench` package where it is installed.

- Instance rows (`lite`, `verified`, `full`) are read with `swebench.harness.utils.load_swebench_dataset`, the
  reader `run_evaluation` itself uses: a local `.json` / `.jsonl` / `.parquet`, a directory holding
  `test.parquet` (or a `save_to_disk` split), or a hub name. Without the package, local files fall back to our own
  reader (so the bundled Lite rows work in any install) and hub names need the `swebench` extra.
- Prompt sets (`oracle`, `bm25-13k`: princeton-nlp/SWE-bench_oracle and SWE-bench_bm25_13K, a `text` column) are
  plain rows: our reader for local files, `datasets` for the hub.
- `instance_table()` / `resolved_flags()` are what trajectories are joined to: the bundled Lite rows (dev + the
  150 test rows) and the bundled mini-swe-agent run's `results_summary.json`.

The hub is probed first, so an offline run fails in seconds with the project's one-line message.
`swebench.inference.make_datasets.tokenize_dataset` is never imported (it downloads a tokenizer at import).
"""

from __future__ import annotations

import functools
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.tasks import _source
from evalsuite.tasks._source import read_json_document, read_records
from evalsuite.tasks._trajectory_formats import as_bool, repo_from_instance_id
from evalsuite.tasks.base import Trajectory
from evalsuite.tasks.description import describe

INSTANCE_SETS = {"lite": "SWE-bench/SWE-bench_Lite", "verified": "SWE-bench/SWE-bench_Verified",
                 "full": "SWE-bench/SWE-bench"}
PROMPT_SETS = {"oracle": "princeton-nlp/SWE-bench_oracle", "bm25-13k": "princeton-nlp/SWE-bench_bm25_13K"}
TASK = describe("swebench")  # tasks/swebench/task.toml: name, licence, source, subsets and their files, turns, scoring
BUNDLED_LITE, BUNDLED_LITE_DEV = (TASK.file(f) for f in TASK.subset("lite").files) if not TASK.missing \
    else (TASK.folder, TASK.folder)  # the 150 Lite test issues, and the dev rows (repository metadata)
BUNDLED_RESULTS = next((TASK.file(f) for f in TASK.files if f.endswith("results_summary.json")), TASK.folder)
EXTRA_HINT = "pip install 'evalsuite[swebench]' (swebench==5.0.2)"


def swebench_loader(needed_for: str | None = None):
    """`load_swebench_dataset`, or None without the package (a UserError naming the extra when `needed_for`)."""
    try:
        from swebench.harness.utils import load_swebench_dataset
    except ImportError as err:
        if needed_for:
            raise UserError(f"{needed_for} needs the swebench package: {EXTRA_HINT}") from err
        return None
    return load_swebench_dataset


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def load_instances(source: str | Path, split: str = "test", hub_label: str | None = None,
                   subset: str | None = None) -> list[dict]:
    """Instance rows from a local file or directory, or a hub name (`hub_label` set), as run_evaluation reads them;
    `subset` names the --subset in messages."""
    if hub_label is not None:
        if not _source.hub_reachable():
            raise UserError(_source.offline_message("swebench", hub_label))
        loader = swebench_loader(f"--task swebench: loading {hub_label} from the hub")
    else:
        path = Path(source)
        named = f"--subset {subset} --data-path {path}" if subset else f"--data-path {path}"
        if path.is_dir() and not ((path / f"{split}.parquet").exists()
                                  or (path / split / "dataset_info.json").exists()):
            raise UserError(f"{named}: a directory of SWE-bench instances must hold {split}.parquet or a save_to_disk "
                            f"'{split}' split (or pass the .json/.jsonl/.parquet file itself)")
        if not path.is_dir() and not path.name.endswith((".json", ".jsonl", ".parquet")):
            raise UserError(f"{named}: SWE-bench instances are read from .json, .jsonl or .parquet")
        loader = swebench_loader(None if path.is_file() else f"{named} (a dataset directory)")
        if loader is None:  # our reader, for local files without the package
            return [row for _, row in read_records(path)]
    try:
        rows = loader(str(source), split)
    except UserError:
        raise
    except Exception as err:  # json, pyarrow, datasets and KeyError('instance_id') all end here
        raise UserError(f"swebench: cannot read instances from {hub_label or source} ({_first_line(err)})") from err
    return [dict(row) for row in rows]


def load_prompt_rows(source: str | Path, hub_label: str | None = None) -> list[tuple[str, dict]]:
    """Prompt-set rows (`text`, `instance_id`, …) from a local file or the hub's test split."""
    if hub_label is not None:
        return _source.hub_rows("swebench", _source.HubSpec(hub_label, split="test"))
    path = Path(source)
    if path.is_dir():
        raise UserError(f"--data-path {path}: a prompt set is one .json/.jsonl/.parquet file with a 'text' column")
    return read_records(path)


@functools.lru_cache(maxsize=1)
def instance_table() -> dict[str, dict]:
    """instance_id → the bundled instance row (Lite dev and the Lite test subset)."""
    table = {}
    for path in (BUNDLED_LITE_DEV, BUNDLED_LITE):
        if path.exists():
            for _, row in read_records(path):
                if isinstance(row.get("instance_id"), str):
                    table[row["instance_id"]] = row
    return table


@functools.lru_cache(maxsize=1)
def resolved_flags() -> dict[str, bool]:
    """instance_id → resolved, for the bundled mini-swe-agent run."""
    if not BUNDLED_RESULTS.exists():
        return {}
    document = read_json_document(BUNDLED_RESULTS)
    return {row["instance_id"]: bool(row["resolved"]) for row in document.get("instances", [])
            if isinstance(row, dict) and "instance_id" in row and "resolved" in row}


def instance_meta(row: dict, fmt: str) -> dict:
    """What a report needs of an instance row (the `resolved` flag where the row carries one)."""
    instance = row.get("instance_id")
    return {"format": fmt, "instance_id": instance, "repo": row.get("repo") or repo_from_instance_id(instance),
            "version": None if row.get("version") is None else str(row.get("version")),
            "resolved": as_bool(row.get("resolved"))}


def join_instances(trajectories: list[Trajectory], flags: dict[str, bool] | None = None) -> list[Trajectory]:
    """Fill each trajectory's `repo`, `version` and `resolved` from the bundled instance rows and resolved flags
    where its own data left them out; `version`/`resolved` stay None where nothing is known."""
    table = instance_table()
    flags = resolved_flags() if flags is None else flags
    for trajectory in trajectories:
        meta = trajectory.meta
        instance = meta.get("instance_id")
        row = table.get(instance, {})
        meta["repo"] = meta.get("repo") or row.get("repo") or repo_from_instance_id(instance)
        if meta.get("version") is None:
            meta["version"] = None if row.get("version") is None else str(row["version"])
        if meta.get("resolved") is None:
            meta["resolved"] = flags.get(instance)
    return trajectories
