"""What used to fall back silently now works as documented: raw-id runs on a base model (no chat template) with
warm-up, `~` in --target, the weights-hash cache outside the model directory, --drafter METHOD=DIR, and the
bundled data lookup of a non-editable install."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from evalsuite import bundled
from evalsuite.cli import app
from evalsuite.errors import UserError
from tests.helpers import load_turns
from evalsuite.target.model import cached_weights_hash, weights_hash
from evalsuite.tasks.base import LoadOptions, get_task
from evalsuite.testing import drop_chat_template
from tests.helpers import dlite_checkpoint

cli = CliRunner()


def run_cli(*args: str):
    return cli.invoke(app, ["run", *args], catch_exceptions=False)


def test_raw_ids_on_a_target_without_chat_template_warm_up_and_run(tiny_llama_dir, tmp_path):
    base_model = Path(shutil.copytree(tiny_llama_dir, tmp_path / "base-model"))
    drop_chat_template(base_model)
    data = tmp_path / "ids.jsonl"
    data.write_text("".join(json.dumps({"id": f"s{i}", "prompt_ids": [10 + i, 40, 50, 60, 70]}) + "\n"
                            for i in range(2)))
    out = tmp_path / "run"
    result = run_cli("--target", str(base_model), "--task", "custom", "--data-path", str(data), "--method",
                     "ngram,ar", "--max-new-tokens", "6", "--out", str(out))  # warm-up on (the default)
    assert result.exit_code == 0, result.output
    turns = load_turns(out)
    assert set(turns.replay) == {"raw"} and len(turns) == 4 and (turns.new_tokens > 0).all()
    assert json.loads((out / "run.json").read_text())["warmup"] is True


def test_target_path_with_tilde_is_expanded(tiny_llama_dir, tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(tiny_llama_dir, home / "models" / "tiny")
    monkeypatch.setenv("HOME", str(home))
    out = tmp_path / "run"
    result = run_cli("--target", "~/models/tiny", "--task", "mt-bench", "--limit", "1", "--max-new-tokens", "3",
                     "--no-warmup", "--out", str(out))
    assert result.exit_code == 0, result.output
    # expanded for loading (the run succeeded); recorded home-relative, as run.json records every path under HOME
    assert json.loads((out / "run.json").read_text())["target_path"] == "~/models/tiny"


def test_weights_hash_is_cached_outside_the_model_directory(tiny_llama_dir, tmp_path, monkeypatch):
    model = Path(shutil.copytree(tiny_llama_dir, tmp_path / "model"))
    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    before = sorted(p.name for p in model.iterdir())
    digest = cached_weights_hash(str(model))
    assert digest == weights_hash(str(model))
    assert sorted(p.name for p in model.iterdir()) == before  # nothing written next to the user's weights
    records = list((tmp_path / "cache" / "weights-sha256").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["sha256"] == digest
    # a stale record (the weights changed: size/mtime differ) is recomputed, not trusted
    shutil.copy(tiny_llama_dir / "model.safetensors", model / "model.safetensors")
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes() + b" ")
    assert cached_weights_hash(str(model)) == weights_hash(str(model)) != digest


def test_drafter_method_path_loads_that_checkpoint(tiny_llama_dir, tmp_path):
    checkpoint = dlite_checkpoint(tmp_path / "my-dlite", SimpleNamespace(hidden_size=64, vocab_size=260,
                                                                         num_layers=4))
    out = tmp_path / "run"
    result = run_cli("--target", str(tiny_llama_dir), "--task", "mt-bench", "--limit", "1", "--max-new-tokens",
                     "3", "--no-warmup", "--method", "dlite,ngram", "--drafter", f"dlite={checkpoint}",
                     "--out", str(out))
    assert result.exit_code == 0, result.output
    drafters = json.loads((out / "run.json").read_text())["drafters"]
    assert drafters["dlite"]["checkpoint"] == str(checkpoint) and drafters["dlite"]["checkpoint_sha256"]


def test_subsets_are_declared_by_the_tasks_that_have_them():
    get_task("gsm8k")
    from evalsuite.tasks.base import TASKS

    with_subsets = {name for name, info in TASKS.items() if info.subsets}
    assert with_subsets == {"alpaca", "bfcl-v3", "longbench-v2", "swebench", "agentmemorybench", "agentlongbench"}
    assert len(get_task("alpaca").load(LoadOptions(subset="alpaca_eval", limit=2))) == 2
    with pytest.raises(UserError, match="task math500 has no subsets"):
        get_task("math500").load(LoadOptions(subset="algebra"))


# ---- bundled data --------------------------------------------------------------------------------------------
def test_bundled_lookup_prefers_the_packaged_copy(tmp_path, monkeypatch):
    packaged, source = tmp_path / "site" / "evalsuite" / "_bundled", tmp_path / "repo"
    monkeypatch.setattr(bundled, "PACKAGED_ROOT", packaged)
    monkeypatch.setattr(bundled, "SOURCE_ROOT", source)
    assert bundled.bundled_path("tasks") == source / "tasks"  # a checkout: the repository's own directory
    (packaged / "tasks").mkdir(parents=True)
    assert bundled.bundled_path("baselines/drafters") == packaged / "baselines" / "drafters"  # a wheel


def test_an_install_without_bundled_data_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(bundled, "PACKAGED_ROOT", tmp_path / "none")
    monkeypatch.setattr(bundled, "SOURCE_ROOT", tmp_path)
    with pytest.raises(UserError) as err:
        get_task("gsm8k").load(LoadOptions(limit=1))
    assert "bundled data of task gsm8k" in str(err.value) and "--data-path" in str(err.value)
    assert "\n" not in str(err.value)
