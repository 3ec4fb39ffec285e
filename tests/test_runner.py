"""End-to-end runs on tiny targets: record schemas and values, pairing with AR, resume, bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.store.records import STEP_SCHEMA, TURN_SCHEMA
from tests.helpers import load_steps, load_turns

cli = CliRunner()


def run_cli(*args: str):
    return cli.invoke(app, ["run", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def ngram_run(tiny_qwen3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "ngram-mt"
    result = run_cli("--method", "ngram,ar", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--limit", "3",
                     "--max-new-tokens", "40", "--k", "5", "--out", str(out))
    assert result.exit_code == 0, result.output
    return out


def test_tables_have_the_documented_schema(ngram_run):
    steps, turns = load_steps(ngram_run), load_turns(ngram_run)
    assert list(steps.columns) == STEP_SCHEMA.names
    assert list(turns.columns) == TURN_SCHEMA.names
    # pandas can read the part directories directly, as the README says
    assert len(pd.read_parquet(ngram_run / "steps.parquet")) == len(steps)
    assert set(turns.method) == {"ngram", "ar"}
    assert len(turns) == 3 * 2 * 2  # samples x turns x methods


def test_tau_and_context_len_follow_from_the_steps(ngram_run):
    steps, turns = load_steps(ngram_run), load_turns(ngram_run)
    for (method, sample, turn), group in steps.groupby(["method", "sample_id", "turn"]):
        row = turns[(turns.method == method) & (turns.sample_id == sample) & (turns.turn == turn)].iloc[0]
        group = group.sort_values("step")
        counted = group[~group.budget_limited]  # τ: pooled over the steps that had room to draft
        assert row.tau == pytest.approx((counted.num_accepted + 1).mean())
        assert row.num_steps == len(group)
        # the KV length grows by exactly what each step emitted, starting from the rendered prompt
        expected = row.context_len + group.emitted.cumsum().shift(fill_value=0)
        assert list(group.context_len) == list(expected)
        assert group.emitted.sum() + 1 == row.new_tokens == len(row.output_ids)
        assert all(list(f) == [i < a for i in range(d)] for f, a, d in
                   zip(group.accept_flags, group.num_accepted, group.num_drafted))
        if method == "ar":
            assert (group.num_drafted == 0).all() and row.tau == 1.0


def test_speculative_output_equals_ar_output(ngram_run):
    turns = load_turns(ngram_run)
    ar = turns[turns.method == "ar"].set_index(["sample_id", "turn"]).output_ids
    ngram = turns[turns.method == "ngram"].set_index(["sample_id", "turn"]).output_ids
    for key in ar.index:
        assert list(ar[key]) == list(ngram[key])


def test_turn_two_context_contains_turn_one(ngram_run):
    turns = load_turns(ngram_run)
    for (method, sample), group in turns.groupby(["method", "sample_id"]):
        first, second = group.sort_values("turn").itertuples()
        assert second.context_len > first.context_len + first.new_tokens - 2


def test_speedup_is_paired_with_ar(ngram_run):
    turns = load_turns(ngram_run)
    ngram = turns[turns.method == "ngram"]
    ar = turns[turns.method == "ar"].set_index(["sample_id", "turn"])
    for row in ngram.itertuples():
        paired = ar.loc[(row.sample_id, row.turn)]
        assert row.ar_decode_s == paired.decode_s and row.ar_new_tokens == paired.new_tokens
        assert row.speedup_turn == pytest.approx((paired.decode_s / paired.new_tokens) /
                                                 (row.decode_s / row.new_tokens))


def test_run_json_records_the_configuration(ngram_run):
    config = json.loads((ngram_run / "run.json").read_text())
    for key in ("target_sha256", "chat_template_sha256", "enable_thinking", "temperature", "seed", "k",
                "max_new_tokens", "drafters", "sample_ids", "dtype", "conventions"):
        assert key in config, key
    env = config["environment"]
    assert env["versions"]["torch"] and env["device_name"] and env["git_commit"]
    assert len(config["target_sha256"]) == 64
    assert config["drafters"]["ngram"]["max_ngram"] == 3
    # "auto" resolved: evalsuite.target.decoder supports the tiny Llama; its product kernels measured on this machine
    choice = config["weight_layout_choice"]
    assert config["weight_layout"] == {"mkl": "fused", "onednn": "fused+onednn", "panel": "fused+panel"}[choice["chosen"]]
    # MKL-packed verify blocks of up to k+1 rows, or oneDNN's unpadded ones
    assert config["packed_block_rows"] == (config["k"] + 1 if choice["chosen"] == "mkl" else 0)


def test_rerun_without_resume_refuses(ngram_run, tiny_qwen3_dir):
    result = run_cli("--method", "ngram,ar", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--limit", "3",
                     "--max-new-tokens", "40", "--k", "5", "--out", str(ngram_run))
    assert result.exit_code == 2 and "--resume" in result.output


def test_resume_refuses_a_changed_configuration(ngram_run, tiny_qwen3_dir):
    result = run_cli("--method", "ngram,ar", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--limit", "3",
                     "--max-new-tokens", "40", "--k", "3", "--out", str(ngram_run), "--resume")
    assert result.exit_code == 2 and "k differs" in result.output


def test_resume_on_finished_run_does_nothing(ngram_run, tiny_qwen3_dir):
    before = sorted(p.stat().st_mtime_ns for p in (ngram_run / "turns.parquet").glob("*.parquet"))
    result = run_cli("--method", "ngram,ar", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--limit", "3",
                     "--max-new-tokens", "40", "--k", "5", "--out", str(ngram_run), "--resume")
    assert result.exit_code == 0, result.output
    after = sorted(p.stat().st_mtime_ns for p in (ngram_run / "turns.parquet").glob("*.parquet"))
    assert before == after


@pytest.mark.parametrize("args, message", [
    (["--method", "nosuch"], "unknown method 'nosuch'"),
    (["--task", "nosuch"], "unknown task 'nosuch'"),
    (["--k", "0"], "--k 0"),
    (["--k", "100"], "--k 100"),
    (["--target", "/no/such/model"], "no such directory"),
    (["--replay", "sideways"], "--replay sideways"),
    (["--out", "/proc/evalsuite-cannot-write"], "not writable"),
])
def test_bad_input_gives_one_line_error(args, message, tiny_llama_dir):
    base = ["--target", str(tiny_llama_dir), "--limit", "1", "--max-new-tokens", "4"]
    result = run_cli(*base, *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_model_dir_without_config_is_a_clear_error(tmp_path):
    result = run_cli("--target", str(tmp_path), "--limit", "1")
    assert result.exit_code == 2 and "no config.json" in result.output


def test_context_longer_than_the_target_is_a_recorded_skip(tmp_path):
    from evalsuite.testing import build_tiny_target

    short = build_tiny_target(tmp_path / "short", "llama", max_positions=64)
    out = tmp_path / "run"
    result = run_cli("--method", "ngram", "--task", "gsm8k", "--target", str(short), "--limit", "3",
                     "--max-new-tokens", "8", "--out", str(out))
    assert result.exit_code == 0, result.output
    turns = load_turns(out)
    assert (turns.stop_reason == "skipped").all()
    assert turns.skip_reason.str.contains("reaches the target maximum of 64").all()
    assert len(load_steps(out)) == 0


def test_method_auto_reads_the_checkpoint(tiny_target, tmp_path):
    """`--method auto --drafter DIR` picks the method from config.json (a released-format DLite checkpoint)."""
    from evalsuite.cli import _infer_auto_method
    from evalsuite.errors import UserError
    from tests.helpers import dlite_checkpoint, zlab_checkpoint

    dlite = dlite_checkpoint(tmp_path / "dlite", tiny_target)
    assert _infer_auto_method(["auto", "ngram"], [str(dlite)]) == ["dlite", "ngram"]
    assert _infer_auto_method(["auto"], [str(zlab_checkpoint(tmp_path / "zlab", tiny_target))]) == ["dflash"]
    with pytest.raises(UserError, match="exactly one --drafter"):
        _infer_auto_method(["auto"], [])


def test_a_compiled_run_records_it_and_every_method_equals_its_ar_pair(tiny_llama_dir, tmp_path):
    out = tmp_path / "compiled"
    result = run_cli("--method", "ngram,ar", "--task", "mt-bench", "--target", str(tiny_llama_dir), "--limit", "2",
                     "--max-new-tokens", "24", "--compile", "--out", str(out))
    assert result.exit_code == 0, result.output
    config = json.loads((out / "run.json").read_text())
    assert config["compile"] is True and config["weight_layout"] == "fused"  # resolved, as recorded
    turns = load_turns(out)
    by_method = {m: g.sort_values(["sample_id", "turn"]).output_ids.map(list).tolist() for m, g in turns.groupby("method")}
    assert by_method["ngram"] == by_method["ar"]


def test_compile_with_cuda_graphs_on_is_a_one_line_error(tiny_llama_dir, tmp_path):
    result = run_cli("--method", "ar", "--task", "mt-bench", "--target", str(tiny_llama_dir), "--limit", "1",
                     "--compile", "--cuda-graphs", "on", "--out", str(tmp_path / "x"))
    assert result.exit_code != 0
    assert "--compile with --cuda-graphs on: choose one way to capture the forwards" in result.output
    assert "Traceback" not in result.output
