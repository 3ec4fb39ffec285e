"""The captured path (evalsuite/target/captured.py) on CPU: the static-shape forwards a CUDA graph records, run eagerly
(`graphs=False`), against transformers' eager code — logits, hidden states and greedy tokens for blocks of 1 … k+1
tokens after a growing context that crosses a span boundary, with rollbacks — and the leased cache's refusals.
The capture itself needs a GPU (benchmarks/gpu_check.sh)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.config import drift_value
from evalsuite.errors import UserError
from evalsuite.target import captured_attention
from evalsuite.target.captured import CapturedSteps, PooledCache
from evalsuite.target.captured_attention import attention_for_rows, resolve_captured_attention
from evalsuite.target.model import TargetModel

K = 7
LAYERS = (-1, 0, 1)
CAPACITY = 600  # spans 256 and 600: the context below crosses from one to the other


def _captured(directory, attention: str = "masked-sdpa") -> TargetModel:
    target = TargetModel.load(str(directory), weight_layout="fused")
    target.prepare_blocks(K + 1)
    target.fused.captured_attention = attention
    target.captured = CapturedSteps(target.fused, target.config, CAPACITY, K + 1, graphs=False)
    return target


# "flash-length" and "split-k" run their plain-torch forms here (their kernels need CUDA; split-k's Triton kernel is
# checked on a CPU by tests/test_split_attention.py): what is checked here is the plumbing around them (query heads
# unfolded, strided K/V views, the live length from the positions)
@pytest.fixture(scope="module", params=[("llama", "masked-sdpa"), ("qwen3", "masked-sdpa"),
                                        ("llama", "flash-length"), ("qwen3", "flash-length"),
                                        ("llama", "split-k"), ("qwen3", "split-k"), ("qwen3", "flash+split")])
def pair(request, tiny_dirs):
    model, attention = request.param
    return _captured(tiny_dirs[model], attention), TargetModel.load(str(tiny_dirs[model]), weight_layout="row-major")


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    scale = max(float(b.abs().max()), 1.0)
    assert float((a - b).abs().max()) <= 1e-4 * scale, what


def test_blocks_across_spans_match_eager(pair):
    captured, eager = pair
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 260, (200,), generator=generator)
    cc, ec = captured.new_cache(), eager.new_cache()
    assert isinstance(cc, PooledCache)
    captured.forward(ids, cc, LAYERS, last_only=True)
    eager.forward(ids, ec, LAYERS, last_only=True)
    spans = set()
    for round_ in range(8):  # 200 → past 256 → ~330: blocks run in both spans
        for n in range(1, K + 3):  # 1 … k+1 captured; k+2 through the fused decoder's ordinary forward
            block = torch.randint(3, 260, (n,), generator=generator)
            length = cc.get_seq_length()
            a, b = captured.forward(block, cc, LAYERS), eager.forward(block, ec, LAYERS)
            assert cc.get_seq_length() == ec.get_seq_length() == length + n
            if n <= K + 1:
                spans.add(captured.captured.span_for(length + n))
            _close(a.logits, b.logits, f"block of {n} at {length}")
            _close(a.hidden, b.hidden, f"hidden states of a block of {n} at {length}")
            assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1)), f"greedy tokens, block of {n}"
            keep = length + max(n // 2, 1)  # a rejected draft's tail rolls back
            cc.crop_to(keep)
            ec.crop_to(keep)
    assert spans == {256, CAPACITY}


def test_greedy_decode_matches_eager_token_for_token(pair):
    captured, eager = pair
    prompt = torch.randint(3, 260, (240,), generator=torch.Generator().manual_seed(3))
    outputs = []
    for target in (captured, eager):
        cache = target.new_cache()
        logits = target.forward(prompt, cache, last_only=True).logits
        tokens = [int(logits[-1].argmax())]
        for _ in range(40):  # crosses the 256 span
            logits = target.forward(torch.tensor(tokens[-1:]), cache).logits
            tokens.append(int(logits[-1].argmax()))
        outputs.append(tokens)
    assert outputs[0] == outputs[1]


def test_capture_records_every_shape_and_counts_late_ones(tiny_dirs):
    target = _captured(tiny_dirs["llama"])
    steps = target.captured
    assert target.prepare_layers([(), (0, 1)]) == 2 * len(steps.spans) * (K + 1)
    cache = target.new_cache()
    target.forward(torch.arange(3, 40), cache, (), last_only=True)
    target.forward(torch.tensor([5, 6, 7]), cache, (0, 1))
    assert steps.late_captures == 0
    target.forward(torch.tensor([5]), cache, (1,))  # a feature set nobody announced
    assert steps.late_captures == 1
    described = steps.describe()
    assert described["late_captures"] == 1 and described["spans"] == [256, CAPACITY]


def test_a_stale_lease_and_an_oversized_context_are_refused(tiny_dirs):
    target = _captured(tiny_dirs["qwen3"])
    first = target.new_cache()
    target.forward(torch.arange(3, 20), first, (), last_only=True)
    second = target.new_cache()
    assert second.get_seq_length() == 0
    with pytest.raises(RuntimeError, match="stale"):
        target.forward(torch.tensor([4]), first)
    with pytest.raises(UserError, match="does not fit the captured KV cache"):
        second.reserve(CAPACITY + 1)
    target.forward(torch.randint(3, 260, (CAPACITY - 2,)), second, (), last_only=True)
    with pytest.raises(UserError, match="does not fit the captured KV cache"):
        target.forward(torch.tensor([4, 5, 6]), second)
    assert target.new_cache(captured=False).__class__.__name__ == "KVCache"


def test_cuda_graphs_on_a_cpu_is_a_one_line_error_and_runs_record_the_resolved_choice(tiny_llama_dir, tmp_path):
    cli = CliRunner()
    refused = cli.invoke(app, ["run", "--method", "ar", "--task", "gsm8k", "--target", str(tiny_llama_dir),
                               "--limit", "1", "--cuda-graphs", "on", "--out", str(tmp_path / "on")])
    assert refused.exit_code == 2 and "CUDA graphs need --device cuda" in refused.output
    assert "Traceback" not in refused.output
    out = tmp_path / "auto"
    ran = cli.invoke(app, ["run", "--method", "ar", "--task", "gsm8k", "--target", str(tiny_llama_dir), "--limit",
                           "1", "--max-new-tokens", "4", "--threads", "1", "--out", str(out)])
    assert ran.exit_code == 0, ran.output
    config = json.loads((out / "run.json").read_text())
    assert config["cuda_graphs"] == "off" and config["captured"] is None
    assert config["captured_attention"] is None  # nothing captured, nothing chosen
    bad = cli.invoke(app, ["run", "--method", "ar", "--task", "gsm8k", "--target", str(tiny_llama_dir),
                           "--limit", "1", "--captured-attention", "flash", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert "--captured-attention flash: choose from auto, masked-sdpa, flash-length, split-k, flash+split" in \
        " ".join(bad.output.split())


def test_captured_attention_resolves_to_the_fastest_exact_one_that_runs(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(captured_attention, "_triton_available", lambda: True)
    assert resolve_captured_attention("auto", cuda, torch.bfloat16) == "flash+split"
    assert resolve_captured_attention("auto", cuda, torch.float16) == "flash+split"
    assert resolve_captured_attention("auto", cuda, torch.float32) == "split-k"  # flash attention has no fp32
    assert resolve_captured_attention("auto", cpu, torch.float32) == "masked-sdpa"
    assert resolve_captured_attention("split-k", cuda, torch.float32) == "split-k"
    with pytest.raises(UserError, match="flash attention needs --dtype bfloat16 or float16"):
        resolve_captured_attention("flash+split", cuda, torch.float32)
    monkeypatch.setattr(captured_attention, "_triton_available", lambda: False)
    assert resolve_captured_attention("auto", cuda, torch.bfloat16) == "masked-sdpa"
    with pytest.raises(UserError, match="the split-K kernel needs triton"):
        resolve_captured_attention("split-k", cuda, torch.bfloat16)
    assert resolve_captured_attention("flash-length", cuda, torch.bfloat16) == "flash-length"
    with pytest.raises(UserError, match="choose from auto, masked-sdpa"):
        resolve_captured_attention("flash", cpu, torch.float32)
    # flash+split: flash attention for one-token decodes, the split-K kernel for every verify block
    assert [attention_for_rows("flash+split", rows) for rows in (1, 2, 8)] == ["flash-length", "split-k", "split-k"]
    assert attention_for_rows("masked-sdpa", 8) == "masked-sdpa"


def test_runs_before_the_captured_attention_field_resume_without_drift():
    # run.json before the field: every captured run attended by masked SDPA; runs without captured forwards
    # record None, which compares the same; a run that changed attention is drift
    assert drift_value("captured_attention", None) == drift_value("captured_attention", "masked-sdpa")
    assert drift_value("captured_attention", None) != drift_value("captured_attention", "flash+split")
