"""The static (preallocated) target KV cache: in-place writes, rollback by length, exact against a fresh prefill."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.errors import UserError
from evalsuite.target.kv_cache import GrowableLayer, KVCache, gqa_sdpa
from tests.helpers import load_turns
from evalsuite.target.model import TargetModel
from evalsuite.testing import byte_tokenizer

LAYERS = (-1, 0, 2)


def fresh(target: TargetModel, ids: list[int]):
    """Logits and hidden states of `ids` from one prefill into an empty cache."""
    return target.forward(torch.tensor(ids), target.new_cache(), LAYERS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_verify_and_rollback_sequences_match_a_fresh_prefill(tiny_target, seed):
    rng = random.Random(seed)
    target = tiny_target
    cache = target.new_cache()
    assert isinstance(cache, KVCache)
    ids = [rng.randrange(4, target.vocab_size) for _ in range(rng.randrange(5, 40))]
    target.forward(torch.tensor(ids), cache, LAYERS)
    for _ in range(12):
        block = [rng.randrange(4, target.vocab_size) for _ in range(rng.randrange(1, 10))]
        out = target.forward(torch.tensor(block), cache, LAYERS)
        ref = fresh(target, ids + block)
        n = len(block)
        torch.testing.assert_close(out.logits, ref.logits[-n:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.hidden, ref.hidden[-n:], rtol=1e-4, atol=1e-4)
        keep = rng.randrange(0, n + 1)  # accept a prefix of the block, roll back the rest
        cache.crop_to(len(ids) + keep)
        ids = ids + block[:keep]
        assert cache.get_seq_length() == len(ids)


def test_static_and_dynamic_caches_give_the_same_decode(tiny_llama_dir):
    static = TargetModel.load(str(tiny_llama_dir), kv_cache="static")
    dynamic = TargetModel.load(str(tiny_llama_dir), kv_cache="dynamic")
    prompt = list(range(10, 70))
    outs = []
    for target in (static, dynamic):
        cache = target.new_cache()
        logits = target.forward(torch.tensor(prompt), cache, last_only=True).logits
        ids = []
        for _ in range(30):
            token = int(logits[-1].argmax())
            ids.append(token)
            logits = target.forward(torch.tensor([token]), cache).logits
        outs.append(ids)
    assert outs[0] == outs[1]
    assert static.model.config._attn_implementation == "evalsuite_sdpa"
    assert dynamic.model.config._attn_implementation == "sdpa"


def test_growth_keeps_the_content_and_writes_in_place():
    layer = GrowableLayer(chunk=4)
    k = torch.randn(1, 2, 3, 8)
    keys, _ = layer.update(k, k.clone())
    assert layer.capacity == 4 and torch.equal(keys, k)
    buffer = layer._k.data
    more = torch.randn(1, 2, 1, 8)
    keys, _ = layer.update(more, more.clone())
    assert layer._k.data is buffer  # no reallocation while the block fits
    assert keys.data_ptr() == buffer.data_ptr()  # a view of the buffer, not a copy
    grow = torch.randn(1, 2, 6, 8)
    keys, values = layer.update(grow, grow.clone())
    assert layer.capacity == 12 and torch.equal(keys, torch.cat([k, more, grow], dim=2))
    layer.crop(-7)
    assert layer.get_seq_length() == 3 and torch.equal(layer.keys, k)
    layer.reserve(30)
    assert layer.capacity == 32 and torch.equal(layer.keys, k)


def test_folded_gqa_attention_equals_repeated_heads():
    torch.manual_seed(0)

    class Module:
        num_key_value_groups = 3
        is_causal = True

    q_len, ctx = 5, 23
    query = torch.randn(1, 6, q_len, 16)
    key, value = torch.randn(1, 2, ctx, 16), torch.randn(1, 2, ctx, 16)
    mask = torch.ones(q_len, ctx, dtype=torch.bool).tril(ctx - q_len).view(1, 1, q_len, ctx)
    out, _ = gqa_sdpa(Module(), query, key, value, mask, scaling=0.25)
    expanded_k = key.repeat_interleave(3, dim=1)
    expanded_v = value.repeat_interleave(3, dim=1)
    ref = torch.nn.functional.scaled_dot_product_attention(query, expanded_k, expanded_v, attn_mask=mask, scale=0.25)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)


# ---- targets with per-layer attention types (sliding window + full, Gemma-3-style rope per layer type) ---------

def build_tiny_gemma3(directory, max_positions: int = 512):
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=260, hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, max_position_embeddings=max_positions, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
    )
    model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    model.generation_config.eos_token_id = 2
    model.save_pretrained(directory, safe_serialization=True)
    byte_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_gemma3_dir(tmp_path_factory):
    return build_tiny_gemma3(tmp_path_factory.mktemp("gemma3"))


def test_sliding_window_layers_stay_exact_past_the_window(tiny_gemma3_dir):
    target = TargetModel.load(str(tiny_gemma3_dir))
    rng = random.Random(0)
    cache = target.new_cache()
    assert [layer.is_sliding for layer in cache.layers] == [True, True, True, False] * 2
    ids = [rng.randrange(4, 260) for _ in range(20)]  # already past the 8-token window
    target.forward(torch.tensor(ids), cache, LAYERS)
    for _ in range(8):
        block = [rng.randrange(4, 260) for _ in range(rng.randrange(1, 9))]
        out = target.forward(torch.tensor(block), cache, LAYERS)
        ref = fresh(target, ids + block)
        torch.testing.assert_close(out.logits, ref.logits[-len(block):], rtol=1e-4, atol=1e-4)
        keep = rng.randrange(0, len(block) + 1)
        cache.crop_to(len(ids) + keep)
        ids += block[:keep]


@pytest.mark.parametrize("method", ["ar", "ngram", "dlite", "eagle3", "dflash", "dspark"])
def test_per_layer_attention_types_run_or_fail_in_one_line(tiny_gemma3_dir, tmp_path, method):
    drafter = [] if method in ("ar", "ngram") else ["--drafter", f"{method}=random"]
    result = CliRunner().invoke(app, [
        "run", "--method", f"ar,{method}" if method != "ar" else "ar", "--task", "gsm8k", "--limit", "1",
        "--target", str(tiny_gemma3_dir), "--max-new-tokens", "24", "--k", "4", "--out", str(tmp_path / "run"),
        *drafter,
    ])
    if result.exit_code == 0:
        turns = load_turns(tmp_path / "run")
        ar = turns[turns.method == "ar"].output_ids.iloc[0]
        assert list(turns[turns.method == method].output_ids.iloc[0]) == list(ar)  # lossless at T=0
    else:
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip() and "Loading weights" not in line]
        assert len(lines) == 1 and "Traceback" not in result.output, result.output


def test_unsupported_layer_types_are_a_one_line_error(tiny_gemma3_dir, monkeypatch):
    import evalsuite.target.kv_cache as kv_cache

    monkeypatch.setattr(kv_cache, "get_layer_types_and_kwargs", lambda config: (["linear_attention"] * 8, [{}] * 8))
    with pytest.raises(UserError, match="--kv-cache dynamic"):
        TargetModel.load(str(tiny_gemma3_dir))
    TargetModel.load(str(tiny_gemma3_dir), kv_cache="dynamic")  # the old engine still takes it


def test_compiled_decode_and_verify_match_eager(tiny_llama_dir):
    eager = TargetModel.load(str(tiny_llama_dir), weight_layout="column-major")
    compiled = TargetModel.load(str(tiny_llama_dir), weight_layout="column-major", compile=True)
    assert compiled.fused is None and compiled._compiled_decoder is not None  # the HF decoder, compiled
    prompt = list(range(10, 50))
    caches = {}
    for name, target in (("eager", eager), ("compiled", compiled)):
        caches[name] = target.new_cache()
        target.forward(torch.tensor(prompt), caches[name], LAYERS, last_only=True)
    for block in ([7], [8, 9, 10, 11], [12], [13, 14, 15]):  # decode, verify, decode at a new length, verify
        outs = {name: target.forward(torch.tensor(block), caches[name], LAYERS)
                for name, target in (("eager", eager), ("compiled", compiled))}
        torch.testing.assert_close(outs["compiled"].logits, outs["eager"].logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(outs["compiled"].hidden, outs["eager"].hidden, rtol=1e-4, atol=1e-4)
        for name, target in (("eager", eager), ("compiled", compiled)):
            caches[name].crop_to(caches[name].get_seq_length() - len(block) + 1)  # roll back all but one


def test_compile_with_onednn_blocks_is_a_one_line_error(tiny_llama_dir):
    with pytest.raises(UserError,
                       match=r"--compile with --weight-layout column-major\+onednn: its prepared weights are opaque"):
        TargetModel.load(str(tiny_llama_dir), weight_layout="column-major+onednn", compile=True)


def test_the_fused_decoders_compiled_decode_and_blocks_match_eager_over_a_growing_context_without_recompiling(
        tiny_llama_dir):
    from torch._dynamo.utils import counters

    eager = TargetModel.load(str(tiny_llama_dir))
    compiled = TargetModel.load(str(tiny_llama_dir), compile=True)
    assert compiled.weight_layout == eager.weight_layout == "fused" and compiled.fused._compiled is not None
    for target in (eager, compiled):
        target.prepare_blocks(8)  # blocks of 3 … 8 rows pad to 8 on packed weights; 2 and 9 rows do not
    fused = compiled.fused
    calls = {"decode": 0, "block": 0}

    graph = fused._compiled

    def counted(x, *args):
        calls["decode" if x.shape[1] == 1 else "block"] += 1
        return graph(x, *args)
    fused._compiled = counted
    caches = {name: target.new_cache() for name, target in (("eager", eager), ("compiled", compiled))}
    prompt = torch.tensor(list(range(10, 50)))
    for name, target in (("eager", eager), ("compiled", compiled)):
        target.forward(prompt, caches[name], LAYERS, last_only=True)
    graphs_at_start = counters["stats"]["unique_graphs"]
    generator = torch.Generator().manual_seed(0)

    def step(size: int, layers: tuple[int, ...]) -> None:
        block = torch.randint(4, eager.vocab_size, (size,), generator=generator)
        outs = {name: target.forward(block, caches[name], layers)
                for name, target in (("eager", eager), ("compiled", compiled))}
        torch.testing.assert_close(outs["compiled"].logits, outs["eager"].logits, rtol=1e-4, atol=1e-4)
        if layers:
            torch.testing.assert_close(outs["compiled"].hidden, outs["eager"].hidden, rtol=1e-4, atol=1e-4)
        assert torch.equal(outs["compiled"].logits.argmax(-1), outs["eager"].logits.argmax(-1))
        if size > 1:
            for cache in caches.values():
                cache.crop_to(cache.get_seq_length() - size // 2)  # a partial rejection
        assert caches["compiled"].get_seq_length() == caches["eager"].get_seq_length()

    # every shape once for both feature-layer sets (a decode, plain blocks, a block padded to the packed 8 rows),
    # twice over at other lengths, as the engine's warm-up does
    for _ in range(2):
        for layers in (LAYERS, ()):
            for size in (1, 2, 5, 9):
                step(size, layers)
    graphs_before = counters["stats"]["unique_graphs"]
    assert graphs_before > graphs_at_start, "nothing ran compiled"
    for index in range(40):  # then decodes and blocks of 1 … 9 rows at growing lengths, with rollbacks
        step(1 if index % 3 == 0 else int(torch.randint(2, 10, (1,), generator=generator)),
             LAYERS if index % 2 else ())
    assert counters["stats"]["unique_graphs"] == graphs_before, "a growing context recompiled"
    assert calls["decode"] >= 16 and calls["block"] >= 30  # every decode and every block ran compiled
    # the compiled forwards wrote the same K/V: a fresh eager decode after both histories agrees
    probe = torch.tensor([7])
    a = eager.forward(probe, caches["eager"]).logits
    with compiled.eager():
        b = compiled.forward(probe, caches["compiled"]).logits
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_more_compiled_shapes_than_dynamos_default_limit_all_run_compiled(tiny_llama_dir):
    """One graph per row count × thread count × decoder: a run (or a process holding several decoders, as a sweep,
    a Ray worker and this suite do) passes dynamo's default of 8 graphs per function, where fullgraph=True would
    fail the run (CI stop 40: "hit config.recompile_limit (8) … GLOBAL_STATE changed: num_threads")."""
    eager = TargetModel.load(str(tiny_llama_dir))
    target = TargetModel.load(str(tiny_llama_dir), compile=True)
    calls = []
    graph = target.fused._compiled
    target.fused._compiled = lambda x, *args: (calls.append(x.shape[1]), graph(x, *args))[1]
    prompt = torch.tensor(list(range(10, 40)))
    saved = torch.get_num_threads()
    generator = torch.Generator().manual_seed(1)
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            caches = [eager.new_cache(), target.new_cache()]
            eager.forward(prompt, caches[0], last_only=True)
            target.forward(prompt, caches[1], last_only=True)
            for size in (1, 2, 3, 4, 5):  # unpacked: one graph per row count
                block = torch.randint(4, eager.vocab_size, (size,), generator=generator)
                want, got = eager.forward(block, caches[0]).logits, target.forward(block, caches[1]).logits
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(saved)
    assert len(calls) == 2 * 5  # 10 compiled forwards (10 graphs) over 2 thread counts × 5 shapes


def test_a_thread_measurement_runs_eagerly_so_the_compiled_kernels_are_built_at_the_chosen_count(tiny_llama_dir):
    from torch._dynamo.utils import counters

    from evalsuite.config import RunConfig
    from evalsuite.engines.hf import HfEngine

    engine = HfEngine(RunConfig(methods=["ar"], task="mt-bench", target=str(tiny_llama_dir), compile=True, threads=2))
    engine.start(["ar"], 2)
    compiled = engine.target.fused._compiled
    graphs = counters["stats"]["unique_graphs"]
    choice = engine._measure_threads([1, 2])
    assert counters["stats"]["unique_graphs"] == graphs, "the thread measurement built the compiled decode"
    assert engine.target.fused._compiled is compiled  # restored afterwards
    assert "measured on the eager forward" in choice["rule"] and choice["chosen"] in (1, 2)
    torch.set_num_threads(1)
