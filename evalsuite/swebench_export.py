"""`evalsuite export swebench RUN_DIR`: the target's own replies in a SWE-bench run as `run_evaluation` predictions.

For every recorded method, one `predictions.jsonl` with one row per decoded single-turn sample:
`{"instance_id", "model_name_or_path", "model_patch"}`. The reply is the turn's `output_ids` (turns.parquet)
decoded with the target's tokenizer (`evalsuite.target.model.load_chat`: tokenizer and template, no weights; from the
run's `target_path` where it is on this machine, else its `target`, or `--tokenizer`; checked against the run's
`tokenizer_sha256`), special tokens skipped as the runner decodes them; the patch is cut from it with SWE-bench's
own `extract_diff` (swebench.inference.make_datasets.utils, as its run_api does). Samples are left out, and counted,
when their turn was skipped (no reply) or when they are agent trajectories (several turns: a replayed agent's actions
hold no patch). Each file is read back with SWE-bench's own `get_predictions_from_file` before the export reports
success.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from evalsuite.conventions import SKIPPED
from evalsuite.errors import UserError
from evalsuite.store.run_store import read_run
from evalsuite.tasks._swebench_data import EXTRA_HINT

SAMPLE_PREFIX = "swebench-"


@dataclass
class MethodExport:
    method: str
    path: Path
    written: int = 0
    skipped_turns: list[str] = field(default_factory=list)  # single-turn samples whose turn was skipped
    agent_samples: int = 0  # multi-turn samples (agent trajectories), not exported


def _swebench_functions():
    try:
        from swebench.harness.utils import get_predictions_from_file
        from swebench.inference.make_datasets.utils import extract_diff
    except ImportError as err:
        raise UserError(f"evalsuite export swebench needs the swebench package: {EXTRA_HINT}") from err
    return extract_diff, get_predictions_from_file


def _local_path(value: str) -> Path | None:
    """A run.json path as written (portable: `~`, or relative to the repository root), on this machine."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return path if path.exists() else None
    for base in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (base / path).exists():
            return base / path
    return None


def target_spec(config: dict, tokenizer: str | None = None) -> str:
    """What `load_chat` loads for a stored run: --tokenizer, else the run's target directory where it is on this
    machine, else the run's `--target` (default, a directory or a hub id)."""
    if tokenizer:
        return tokenizer
    local = _local_path(config["target_path"]) if config.get("target_path") else None
    if local is not None:
        return str(local)
    return config.get("target") or "default"


def load_run_chat(config: dict, tokenizer: str | None = None):
    """The run's target tokenizer and template (no weights), checked against the run's tokenizer_sha256."""
    from evalsuite.target.model import load_chat

    spec = target_spec(config, tokenizer)
    try:
        chat = load_chat(spec)
    except UserError as err:
        raise UserError(f"cannot load the run's tokenizer ({err}); pass --tokenizer DIR (the run's target model "
                        "directory)") from err
    expected, found = config.get("tokenizer_sha256"), chat.hashes()["tokenizer_sha256"]
    if expected and found != expected:
        raise UserError(f"the tokenizer of {spec} is not the run's (vocabulary hash {found}, the run recorded "
                        f"{expected}); pass --tokenizer with the run's target directory")
    return chat


def export_predictions(run_dir: Path, out_dir: Path | None = None, tokenizer: str | None = None,
                       model_name: str | None = None) -> list[MethodExport]:
    extract_diff, get_predictions_from_file = _swebench_functions()
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").is_file():
        raise UserError(f"{run_dir}: no run.json; pass a run directory written by `evalsuite run --out`")
    tables = read_run(run_dir)
    config = tables.config or {}
    if config.get("task") != "swebench":
        raise UserError(f"{run_dir}: a run of task {config.get('task')!r}; predictions are exported from "
                        "--task swebench runs")
    turns = tables.turns
    if turns.empty:
        raise UserError(f"{run_dir}: no finished turns to export")
    chat = load_run_chat(config, tokenizer)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "swebench-predictions"
    prefix = model_name or f"evalsuite__{config.get('run_id') or run_dir.name}"
    exports = []
    for method, rows in turns.groupby("method", sort=True):
        export = MethodExport(method, out_dir / method / "predictions.jsonl")
        predictions = []
        for sample_id, sample in rows.groupby("sample_id", sort=True):
            if len(sample) > 1 or not bool(sample.iloc[0]["last"]):
                export.agent_samples += 1
                continue
            row = sample.iloc[0]
            if row.stop_reason == SKIPPED or row.output_ids is None:
                export.skipped_turns.append(sample_id)
                continue
            reply = chat.decode([int(i) for i in row.output_ids])
            predictions.append({"instance_id": sample_id.removeprefix(SAMPLE_PREFIX),
                                "model_name_or_path": f"{prefix}__{method}", "model_patch": extract_diff(reply)})
        export.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = export.path.with_name(f".{export.path.name}.tmp")
        tmp.write_text("".join(json.dumps(p) + "\n" for p in predictions))
        tmp.replace(export.path)
        export.written = len(predictions)
        try:  # SWE-bench's own reader, as run_evaluation calls it
            get_predictions_from_file(str(export.path), "SWE-bench/SWE-bench_Lite", "test")
        except (ValueError, KeyError, json.JSONDecodeError) as err:
            raise UserError(f"{export.path}: SWE-bench's reader refuses the file ({err})") from err
        exports.append(export)
    return exports
