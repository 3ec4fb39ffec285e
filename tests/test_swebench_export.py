"""`evalsuite export swebench RUN_DIR`: a real run on a tiny target, exported and read back with SWE-bench's own
prediction-loading checks (`get_predictions_from_file`, `get_dataset_from_preds` against the instance rows)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.hashing import text_hash
from evalsuite.run.runner import Runner
from evalsuite.store.records import TurnRecord
from evalsuite.store.run_store import RunStore
from evalsuite.target.model import TargetModel
from evalsuite.tasks._swebench_data import BUNDLED_LITE
from evalsuite.testing import build_tiny_target
from tests.helpers import load_turns

pytest.importorskip("swebench.harness.utils")
from swebench.harness.run_evaluation import get_dataset_from_preds  # noqa: E402
from swebench.harness.utils import get_predictions_from_file  # noqa: E402
from swebench.inference.make_datasets.utils import extract_diff  # noqa: E402

from evalsuite.swebench_export import export_predictions  # noqa: E402

DIFF = ("diff --git a/src/util.py b/src/util.py\n--- a/src/util.py\n+++ b/src/util.py\n@@ -1,2 +1,2 @@\n"
        " def last(xs):\n-    return xs[len(xs)]\n+    return xs[-1]\n")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("tiny-4k"), "llama", max_positions=4096)


@pytest.fixture(scope="module")
def lite_run(target_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "lite"
    runner = Runner(RunConfig(methods=["ngram", "ar"], task="swebench", subset="lite", limit=2, target=str(target_dir),
                              max_new_tokens=12, k=3, warmup=False), out)
    runner.load()
    runner.run()
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_predictions_of_a_real_run_pass_swebenchs_own_checks(lite_run, target_dir, tmp_path, monkeypatch):
    exports = export_predictions(lite_run, tmp_path / "preds")
    assert [e.method for e in exports] == ["ar", "ngram"]
    target = TargetModel.load(str(target_dir))
    turns = load_turns(lite_run)
    for export in exports:
        assert export.path == tmp_path / "preds" / export.method / "predictions.jsonl" and export.written == 2
        rows = read_jsonl(export.path)
        assert all(set(r) == {"instance_id", "model_name_or_path", "model_patch"} for r in rows)
        for row in rows:  # the target's own reply, cut as swebench's extract_diff cuts it
            output = turns[(turns.method == export.method) & (turns.sample_id == f"swebench-{row['instance_id']}")]
            assert row["model_patch"] == extract_diff(target.chat.decode(list(output.iloc[0].output_ids)))
            assert row["model_name_or_path"] == f"evalsuite__lite__{export.method}"
        predictions = get_predictions_from_file(str(export.path), str(BUNDLED_LITE), "test")
        monkeypatch.chdir(tmp_path)  # run_evaluation looks for earlier logs under ./logs
        found = get_dataset_from_preds(str(BUNDLED_LITE), "test", None, {p["instance_id"]: p for p in predictions},
                                       "check", rewrite_reports=False)
        assert {row["instance_id"] for row in found} <= {p["instance_id"] for p in predictions}
    ar, ngram = (read_jsonl(e.path) for e in exports)
    assert [r["model_patch"] for r in ar] == [r["model_patch"] for r in ngram]  # lossless at T=0


def write_planted_run(run_dir: Path, target_dir: Path, replies: dict[str, str | None], turns_per_sample: int = 1):
    """A run directory whose turns hold the given replies (None: a skipped turn), encoded with the target."""
    target = TargetModel.load(str(target_dir))
    store = RunStore(run_dir)
    store.prepare()
    store.write_config({"task": "swebench", "target": str(target_dir), "target_path": str(target_dir),
                        "run_id": run_dir.name, "methods": ["ar"],
                        "tokenizer_sha256": text_hash(json.dumps(target.tokenizer.get_vocab(), sort_keys=True))})
    for sample, reply in replies.items():
        for turn in range(turns_per_sample):
            ids = [] if reply is None else target.tokenizer(reply, add_special_tokens=False)["input_ids"]
            record = TurnRecord(run_id=run_dir.name, method="ar", task="swebench", sample_id=sample, turn=turn,
                                replay="free", context_len=10, prompt_tokens=10, prefill_tokens=10, new_tokens=len(ids),
                                num_steps=1, decode_s=0.0, tau=1.0, stop_reason="skipped" if reply is None else "eos",
                                skip_reason="too long" if reply is None else "", output_ids=ids,
                                last=turn == turns_per_sample - 1)
            store.write_turn(sample, turn, [], [record])


def test_the_diff_is_extracted_and_skips_are_counted(target_dir, tmp_path):
    run = tmp_path / "planted"
    write_planted_run(run, target_dir, {
        "swebench-django__django-15202": f"Here is the fix.\n<patch>\n{DIFF}</patch>\nDone.",
        "swebench-astropy__astropy-12907": f"```diff\n{DIFF}```",
        "swebench-sympy__sympy-20590": None})
    export, = export_predictions(run)
    assert export.path == run / "swebench-predictions" / "ar" / "predictions.jsonl"
    rows = {r["instance_id"]: r["model_patch"] for r in read_jsonl(export.path)}
    assert rows == {"django__django-15202": f"\n{DIFF}", "astropy__astropy-12907": DIFF}
    assert export.skipped_turns == ["swebench-sympy__sympy-20590"]


def test_agent_trajectories_are_left_out_and_the_cli_says_so(target_dir, tmp_path):
    run = tmp_path / "agent"
    write_planted_run(run, target_dir, {"swebench-django__django-15202": "ls -la"}, turns_per_sample=3)
    result = CliRunner().invoke(app, ["export", "swebench", str(run), "--out", str(tmp_path / "p"),
                                      "--model-name", "mine"])
    assert result.exit_code == 0, result.output
    assert "0 predictions" in result.output and "1 multi-turn agent trajectories left out" in result.output
    assert (tmp_path / "p" / "ar" / "predictions.jsonl").read_text() == ""


def test_bad_runs_are_one_line_errors(target_dir, lite_run, tmp_path):
    with pytest.raises(UserError, match="no run.json"):
        export_predictions(tmp_path)
    other = tmp_path / "gsm"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"task": "gsm8k"}))
    with pytest.raises(UserError, match="a run of task 'gsm8k'; predictions are exported from --task swebench"):
        export_predictions(other)
    copied = tmp_path / "copied"
    shutil.copytree(lite_run, copied)
    config = json.loads((copied / "run.json").read_text())
    (copied / "run.json").write_text(json.dumps({**config, "tokenizer_sha256": "0123456789abcdef"}))
    with pytest.raises(UserError, match="is not the run's .*pass --tokenizer"):
        export_predictions(copied, tmp_path / "x")
    (copied / "run.json").write_text(json.dumps({**config, "target": "/gone", "target_path": "/gone"}))
    with pytest.raises(UserError, match="cannot load the run's tokenizer .*/gone.*; pass --tokenizer"):
        export_predictions(copied, tmp_path / "x")
    result = CliRunner().invoke(app, ["export", "swebench", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "no run.json" in result.output


def test_the_records_carry_each_instances_repository(lite_run):
    """The runner copies Trajectory.meta["repo"] into every turn, so results split by repository."""
    from evalsuite.tasks import LoadOptions, get_task

    repos = {t.sample_id: t.meta["repo"] for t in get_task("swebench").load(LoadOptions(subset="lite"))}
    turns = load_turns(lite_run)
    assert all(row.repo == repos[row.sample_id] and "/" in row.repo for row in turns.itertuples())
