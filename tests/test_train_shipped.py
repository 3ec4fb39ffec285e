"""The trained default drafters shipped in baselines/drafters/: present, within the size budget, hashes recorded in
their model cards; (integration) they load for the default target and accept on held-out GSM8K samples."""

from __future__ import annotations

import json
import re
from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from evalsuite.methods.checkpoints import DEFAULT_DRAFTER_ROOT, checkpoint_sha256, detect_method, read_config
from evalsuite.hashing import file_sha256

METHODS = ("dlite", "dflash", "dspark", "eagle3")
BUDGET_BYTES = 40_000_000  # all shipped drafters together


def test_each_method_ships_a_released_format_checkpoint_with_its_card():
    for method in METHODS:
        directory = DEFAULT_DRAFTER_ROOT / method
        for name in ("config.json", "model.safetensors", "MODEL_CARD.md", "training_report.json"):
            assert (directory / name).exists(), f"{method}: {name} missing"
        assert detect_method(read_config(directory)) == method


def test_the_cards_record_the_shipped_hashes():
    for method in METHODS:
        directory = DEFAULT_DRAFTER_ROOT / method
        card = (directory / "MODEL_CARD.md").read_text()
        recorded = re.search(r"drafter sha256 .*?`([0-9a-f]{64})`", card).group(1)
        assert recorded == checkpoint_sha256(directory), method
        assert file_sha256(directory / "model.safetensors") in card, method
        report = json.loads((directory / "training_report.json").read_text())
        assert report["checkpoint_sha256"] == recorded and report["method"] == method


def test_the_shipped_drafters_fit_the_size_budget():
    total = sum((DEFAULT_DRAFTER_ROOT / m / "model.safetensors").stat().st_size for m in METHODS)
    assert total <= BUDGET_BYTES, total


@pytest.mark.integration
@pytest.mark.parametrize("method", METHODS)
def test_a_three_sample_gsm8k_run_with_the_shipped_drafter_accepts(tmp_path, method):
    from evalsuite.cli import app
    from evalsuite.report.summary import summary_rows

    out = tmp_path / method
    result = CliRunner().invoke(app, ["run", "--method", method, "--task", "gsm8k", "--limit", "3",
                                      "--max-new-tokens", "64", "--k", "7", "--out", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = json.loads((out / "run.json").read_text())
    assert run["drafter_sha256"][method] == checkpoint_sha256(DEFAULT_DRAFTER_ROOT / method)  # no flag needed
    row = next(r for r in summary_rows(out) if r["method"] == method)
    assert row["tau"] > 1.5, row


def test_the_recorded_commands_reproduce_the_shipped_recipes():
    """Each shipped drafter's recorded `evalsuite train` command gives exactly the recorded steps and options, and a
    warm start names the checkpoint it started from (the shipped drafters were fine-tuned from their predecessors)."""
    import shlex

    from evalsuite.train.recipes.common import parse_overrides, recipe_for

    for method in METHODS:
        report = json.loads((DEFAULT_DRAFTER_ROOT / method / "training_report.json").read_text())
        argv = shlex.split(report["command"])
        sets = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")
        steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else recipe_for(method).default_steps
        options_type = recipe_for(method).options_type
        assert report["steps"] == steps, method
        expected = asdict(parse_overrides(options_type, sets, method))
        recorded = report["recipe"]["options"]
        assert set(recorded) <= set(expected), (method, set(recorded) - set(expected))
        # options added after a drafter was trained (e.g. DLite's draft_vocab) must default to what it was trained with
        defaults = asdict(options_type())
        added = {k: expected[k] for k in set(expected) - set(recorded)}
        assert added == {k: defaults[k] for k in added}, (method, added)
        assert recorded == {k: expected[k] for k in recorded}, method
        if "--init" in argv:
            assert re.fullmatch(r"[0-9a-f]{64}", report["init"]["checkpoint_sha256"]), method


def _strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def test_no_shipped_config_holds_a_path():
    for method in METHODS:
        config = json.loads((DEFAULT_DRAFTER_ROOT / method / "config.json").read_text())
        assert "_name_or_path" not in config, method
        paths = [s for s in _strings(config) if s.startswith(("/", "~")) or re.match(r"^[A-Za-z]:\\", s)]
        assert paths == [], f"{method}/config.json holds {paths}"


def test_the_checkpoint_writer_drops_where_a_config_was_loaded_from(tmp_path):
    import torch

    from evalsuite.train.recipes.common import save_checkpoint

    config = {"_name_or_path": str(tmp_path / "cache" / "target"), "hidden_size": 8,
              "nested": {"_name_or_path": "/elsewhere", "keep": 1}}
    save_checkpoint(tmp_path / "ckpt", config, {"w": torch.zeros(2)})
    text = (tmp_path / "ckpt" / "config.json").read_text()
    assert json.loads(text) == {"hidden_size": 8, "nested": {"keep": 1}}
    assert str(tmp_path) not in text


QWEN_ROOT = DEFAULT_DRAFTER_ROOT / "qwen2.5-coder-0.5b"  # the 32k target's drafters, shipped as each finishes
QWEN_BUDGET_BYTES = 60_000_000


def _qwen_shipped() -> list[str]:
    return [m for m in METHODS if (QWEN_ROOT / m / "model.safetensors").exists()]


def test_the_32k_targets_shipped_drafters_carry_their_cards_hashes_and_fit_the_budget():
    shipped = _qwen_shipped()
    assert "dlite" in shipped  # the first finished (issue #31); the others join as their training ends
    total = 0
    for method in shipped:
        directory = QWEN_ROOT / method
        assert detect_method(read_config(directory)) == method
        card = (directory / "MODEL_CARD.md").read_text()
        recorded = re.search(r"drafter sha256 .*?`([0-9a-f]{64})`", card).group(1)
        assert recorded == checkpoint_sha256(directory), method
        report = json.loads((directory / "training_report.json").read_text())
        assert report["checkpoint_sha256"] == recorded and report["method"] == method
        assert report["target"].startswith("Qwen/Qwen2.5-Coder-0.5B-Instruct"), report["target"]
        assert re.fullmatch(r"[0-9a-f]{64}", report["target_sha256"])
        assert "| gsm8k | all |" in card, f"{method}: no held-out GSM8K row in its card"
        total += (directory / "model.safetensors").stat().st_size
    assert total <= QWEN_BUDGET_BYTES, total
