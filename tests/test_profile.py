"""`evalsuite profile` on tiny shapes: a batched target forward equals B single forwards, the batched drafters
compute what B single-stream drafters compute, the outputs have their columns, and a point over the memory budget
is skipped and recorded (estimated before anything is allocated)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.errors import UserError
from evalsuite.methods.base import Sampling, get_method
from evalsuite.profile.batched import batched_drafter
from evalsuite.profile.memory import kv_bytes_per_token, target_point_bytes
from evalsuite.profile.shapes import build_target, random_target, shape_config
from evalsuite.profile.sweep import parse_sizes, run_profile
from evalsuite.target.model import TargetModel

B = 3


@pytest.mark.parametrize("layout", ["row-major", "column-major+onednn"])
def test_batched_forward_equals_single_forwards(tiny_target: TargetModel, layout):
    target = tiny_target
    if layout == "row-major" and target.weight_layout != "row-major":
        target = TargetModel.load(target.model_dir, "cpu", weight_layout="row-major")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 260, (B, 30), generator=generator)
    context, block = 22, 5
    singles_decode, singles_block = [], []
    for row in ids:
        cache = target.new_cache()
        target.forward(row[:context], cache)
        singles_decode.append(target.forward(row[context: context + 1], cache).logits)
        cache.crop_to(context)
        singles_block.append(target.forward(row[context: context + block], cache).logits)
    cache = target.new_cache()
    target.forward_batch(ids[:, :context], cache)
    assert cache.get_seq_length() == context and cache.layers[0].keys.shape[0] == B
    decode = target.forward_batch(ids[:, context: context + 1], cache)
    cache.crop_to(context)
    verify = target.forward_batch(ids[:, context: context + block], cache)
    assert decode.shape == (B, 1, target.vocab_size) and verify.shape == (B, block, target.vocab_size)
    tolerance = 1e-5 if layout == "row-major" else 2e-4  # oneDNN serves 2–16-row products, MKL the others
    for i in range(B):
        torch.testing.assert_close(decode[i], singles_decode[i], atol=tolerance, rtol=0)
        torch.testing.assert_close(verify[i], singles_block[i], atol=tolerance, rtol=0)
    # a different row's context gives different logits: the rows are not mixed up
    assert (verify[0] - singles_block[1]).abs().max() > 1e-3


def test_synthetic_fill_holds_the_context_for_every_row(tiny_target: TargetModel):
    cache = tiny_target.new_cache()
    cache.fill_synthetic(tiny_target.config, 2, 100, torch.float32, torch.device("cpu"), room=8)
    assert cache.get_seq_length() == 100 and cache.layers[0].keys.shape[:1] == (2,)
    logits = tiny_target.forward_batch(torch.full((2, 8), 5), cache)
    assert logits.shape[:2] == (2, 8) and cache.get_seq_length() == 108 and torch.isfinite(logits).all()
    assert cache.nbytes() == kv_bytes_per_token(tiny_target.config, torch.float32) * 2 * 1024  # one chunk


@pytest.fixture(scope="module")
def tiny_shape_target():
    config, name = shape_config("tiny")
    return random_target(config, name, "cpu", torch.float32, "row-major")


@pytest.mark.parametrize("name,options", [("dlite", {}), ("dlite", {"anchor_group_size": 2}), ("eagle3", {}),
                                          ("eagle3", {"format": "specforge", "draft_vocab_size": 300}),
                                          ("dflash", {}), ("dflash", {"layout": "block7"}), ("dspark", {})])
def test_batched_drafter_equals_single_streams(tiny_shape_target, name, options):
    """Three streams drafted together propose, step after step, what each stream's own drafter proposes, with
    commits of several accepted tokens in between."""
    target = tiny_shape_target
    options = {**options, "drafter": "random"}
    singles = [get_method(name).factory(target, options) for _ in range(B)]
    generator = torch.Generator().manual_seed(1)
    n, k = 40, 5
    ids = torch.randint(4, 260, (B, n + 20), generator=generator)
    features = torch.randn(B, n + 20, len(singles[0].feature_layers), target.hidden_size, generator=generator)
    for i, drafter in enumerate(singles):
        drafter.start_turn(ids[i, : n + 1], features[i, :n])
    batched = batched_drafter(singles[0], B)
    assert batched.batching == "batched"
    batched.load_streams(singles)
    for step in range(3):
        got = batched.propose(k)
        want = torch.stack([d.propose(k, Sampling(), None).tokens for d in singles])
        assert torch.equal(got, want), f"step {step}: {got.tolist()} != {want.tolist()}"
        accepted = torch.stack([torch.cat([want[i, : step % 3], ids[i, n + step: n + step + 1]]) for i in range(B)])
        rows = features[:, n + 3 * step: n + 3 * step + accepted.shape[1]]
        for i, drafter in enumerate(singles):
            drafter.commit(accepted[i], rows[i])
        batched.commit(accepted, rows)


def test_model_free_methods_run_as_sequential_copies(tiny_shape_target):
    target = tiny_shape_target
    copies = []
    runner = batched_drafter(get_method("ngram").factory(target, {}), 3,
                             lambda: copies.append(1) or get_method("ngram").factory(target, {}))
    assert runner.batching == "sequential" and len(copies) == 2
    text = torch.tensor([5, 6, 7, 8, 5, 6, 7, 9, 5, 6] * 4)
    runner.fill(torch.stack([text] * 3), 30)
    assert runner.step(4) == 4 and all(m.ids.numel() == 32 for m in runner.methods)  # one token committed each


def test_profile_writes_both_tables_and_skips_what_does_not_fit(tmp_path):
    config, _ = shape_config("tiny")
    # room for batch 1 at 64 tokens (one 1024-token chunk of KV) but not for batch 2, nor for 2048 tokens
    fits = target_point_bytes(config, torch.float32, 1, 64, 8)
    assert target_point_bytes(config, torch.float32, 2, 64, 8) > fits + 40_000
    budget = f"{fits + 40_000}B"
    result = CliRunner().invoke(app, ["profile", "--target-shape", "tiny", "--method", "dlite,eagle3,ngram",
                                      "--batch", "1,2", "--contexts", "64,2048", "--k", "3", "--warmup", "1",
                                      "--repeats", "1", "--memory-budget", budget, "--threads", "1",
                                      "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    target = pd.read_parquet(tmp_path / "p" / "target_cost.parquet")
    draft = pd.read_parquet(tmp_path / "p" / "draft_cost.parquet")
    assert list(target.columns[:7]) == ["device", "target", "dtype", "batch", "context", "block", "ms"]
    assert list(draft.columns[:8]) == ["device", "target", "method", "batch", "context", "k", "draft_ms",
                                       "state_bytes"]
    assert len(target) == 2 * 2 * 4  # batches × contexts × blocks 1 … k+1
    measured = target[target.fits]
    assert set(zip(measured.batch, measured.context)) == {(1, 64)} and (measured.ms > 0).all()
    skipped = target[~target.fits]
    assert skipped.ms.isna().all() and skipped.note.str.contains("budget").all()
    assert (skipped.est_bytes > fits + 40_000).all()
    run = json.loads((tmp_path / "p" / "run.json").read_text())
    recorded = {(s["batch"], s["context"]) for s in run["skipped"] if s["what"] == "target"}
    assert recorded == {(2, 64), (1, 2048), (2, 2048)}
    assert run["kv_bytes_per_token"] == kv_bytes_per_token(config, torch.float32)
    assert run["environment"]["versions"]["torch"] and run["spec"]["k"] == 3
    # drafters: batch 1 is the method itself, batch 2 batched (learned) or sequential copies (model-free); the
    # draft KV of two streams is twice one stream's; whatever did not fit is recorded the same way
    assert len(draft) == 3 * 2 * 2
    ok = draft[draft.fits].set_index(["method", "batch", "context"])
    assert ok.loc[("dlite", 1, 64)].batching == "method" and ok.loc[("ngram", 2, 64)].batching == "sequential"
    assert ok.loc[("eagle3", 2, 64)].batching == "batched" and ok.loc[("eagle3", 2, 64)].draft_ms > 0
    entry = 2 * 2 * 16 * 4  # K and V of one entry: 2 KV heads × head_dim 16, fp32
    assert ok.loc[("eagle3", 2, 64)].state_bytes >= 2 * 64 * entry
    not_fit = draft[~draft.fits]
    assert not_fit.draft_ms.isna().all() and not_fit.note.str.contains("budget").all()
    assert len([s for s in run["skipped"] if s["what"] != "target"]) == len(not_fit)


def test_weights_that_do_not_fit_are_refused_before_allocating(monkeypatch):
    from evalsuite.profile import memory

    monkeypatch.setattr(memory, "_meminfo", lambda key: 1 << 30)  # 1 GiB available: an 8B shape cannot load
    with pytest.raises(UserError, match="weights need .* GiB"):
        build_target(None, "qwen3-8b", "cpu", None)


def test_sizes_and_shapes_parse():
    assert parse_sizes("1k..8k", "contexts") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1,2,4,4", "batch") == [1, 2, 4]
    with pytest.raises(UserError):
        parse_sizes("1x", "batch")
    config, name = shape_config("qwen3-8b")
    assert (name, config.num_hidden_layers, config.num_key_value_heads) == ("qwen3-8b", 36, 8)
    assert kv_bytes_per_token(config, torch.bfloat16) == 36 * 2 * 8 * 128 * 2
    with pytest.raises(UserError, match="not a named shape"):
        shape_config("qwen9-999b")
    with pytest.raises(UserError, match="--k"):
        run_profile("unused", target_shape="tiny", k=0)


@pytest.mark.parametrize("args, message", [
    (["--target-shape", "tiny", "--method", "foo"], "unknown method 'foo'"),
    (["--target-shape", "tiny", "--batch", "0"], "sizes must be >= 1"),
    (["--target-shape", "nope"], "not a named shape"),
    (["--target-shape", "tiny", "--target", "default"], "not both"),
    (["--target-shape", "tiny", "--memory-budget", "lots"], "write a size"),
])
def test_bad_profile_inputs_are_one_line_and_leave_no_directory(tmp_path, args, message):
    out = tmp_path / "never"
    result = CliRunner().invoke(app, ["profile", *args, "--out", str(out)])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()
