"""The fused decoder (evalsuite/target/decoder.py) against transformers' eager code on tiny random targets: logits, hidden
states and greedy tokens for one-token decodes, verify blocks of 1 … k+1 tokens (padded to the packed row count
or not) after a growing context, chunked prefills, batches, and the cache it leaves."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from evalsuite.errors import UserError
from evalsuite.target.decoder import PREFILL_CHUNK, supported
from evalsuite.target.model import TargetModel
from evalsuite.testing import byte_tokenizer

K = 7
LAYERS = (-1, 0, 2, 3)  # the embeddings, two inner layers, and the last one (after the final norm)


@pytest.fixture(scope="module")
def tiny_qwen2_dir(tmp_path_factory):
    """Qwen2: biases on q/k/v, tied embeddings."""
    directory = tmp_path_factory.mktemp("tiny-qwen2")
    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=260, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # non-zero biases, so that dropping them would show
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
        model.model.embed_tokens.weight.mul_(4.0)
    model.generation_config.eos_token_id = 2
    model.save_pretrained(directory, safe_serialization=True)
    byte_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen2"])
def pair(request, tiny_dirs, tiny_qwen2_dir):
    directory = tiny_qwen2_dir if request.param == "qwen2" else tiny_dirs[request.param]
    fused = TargetModel.load(str(directory), weight_layout="fused")
    eager = TargetModel.load(str(directory), weight_layout="row-major")
    return fused, eager


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    scale = max(float(b.abs().max()), 1.0)
    assert float((a - b).abs().max()) <= 1e-4 * scale, what


@pytest.mark.parametrize("packed,attention,products", [(False, "gemm", "mkl"), (True, "gemm", "mkl"),
                                                       (True, "sdpa", "mkl"), (True, "gemm", "onednn"),
                                                       (True, "gemm", "panel"), (True, "kernel", "panel")])
def test_blocks_after_a_growing_context_match_eager(pair, packed, attention, products):
    """Both block attentions (the CPU's GEMMs over a reused score buffer, and SDPA) and the product kernels (MKL's
    packed GEMM with padded blocks; oneDNN's reordered weights and evalsuite's panels, unpadded) against eager code."""
    fused, eager = pair
    assert fused.fused.prepare_blocks(K + 1 if packed else 1, products) == packed
    assert fused.fused.products == products
    assert (fused.fused.block_attention == "kernel") == (products == "panel")  # the panels bring the attention kernel
    fused.fused.block_attention = attention
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 260, (300,), generator=generator)
    fc, ec = fused.new_cache(), eager.new_cache()
    a, b = fused.forward(ids, fc, LAYERS, last_only=True), eager.forward(ids, ec, LAYERS, last_only=True)
    _close(a.logits, b.logits, "prefill logits")
    _close(a.hidden, b.hidden, "prefill hidden states")
    assert a.logits.shape == (1, 260) and a.hidden.shape == (300, len(LAYERS), 64)
    for round_ in range(2):  # the context grows between rounds: accepted blocks stay in the cache
        for n in range(1, K + 3):  # 1 … k+2: unpadded, padded to k+1, exactly k+1, and past it
            block = torch.randint(3, 260, (n,), generator=generator)
            length = fc.get_seq_length()
            a, b = fused.forward(block, fc, LAYERS), eager.forward(block, ec, LAYERS)
            assert fc.get_seq_length() == ec.get_seq_length() == length + n  # padding never stays in the cache
            assert a.logits.shape == b.logits.shape == (n, 260)
            _close(a.logits, b.logits, f"block of {n}")
            _close(a.hidden, b.hidden, f"hidden states of a block of {n}")
            assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1)), f"greedy tokens of a block of {n}"
            keep = length + max(n // 2, 1)  # roll back part of the block, as a rejected draft would be
            fc.crop_to(keep)
            ec.crop_to(keep)
    fused.prepare_blocks(1)
    fused.fused.block_attention = "gemm"


@pytest.mark.parametrize("products", ["mkl", "onednn", "panel"])
def test_greedy_decode_matches_eager_token_for_token(pair, products):
    fused, eager = pair
    fused.fused.prepare_blocks(K + 1, products)
    prompt = torch.randint(3, 260, (40,), generator=torch.Generator().manual_seed(3))
    outputs = []
    for target in (fused, eager):
        cache = target.new_cache()
        logits = target.forward(prompt, cache, last_only=True).logits
        tokens = [int(logits[-1].argmax())]
        for _ in range(60):
            logits = target.forward(torch.tensor(tokens[-1:]), cache).logits
            tokens.append(int(logits[-1].argmax()))
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
    fused.prepare_blocks(1)


@pytest.mark.parametrize("products", ["mkl", "onednn", "panel"])
def test_a_verified_block_gives_the_decodes_tokens(pair, products):
    """What speculative decoding relies on: verifying the greedy continuation as one block returns, at every
    position, the token a one-token decode would produce there."""
    fused, _ = pair
    fused.fused.prepare_blocks(K + 1, products)
    prompt = torch.randint(3, 260, (50,), generator=torch.Generator().manual_seed(4))
    cache = fused.new_cache()
    first = int(fused.forward(prompt, cache, last_only=True).logits[-1].argmax())
    greedy = [first]
    for _ in range(K + 1):
        greedy.append(int(fused.forward(torch.tensor(greedy[-1:]), cache).logits[-1].argmax()))
    cache.crop_to(prompt.numel())
    for n in range(1, K + 2):
        block = torch.tensor(greedy[:n])
        verified = fused.forward(block, cache).logits.argmax(-1).tolist()
        assert verified == greedy[1:n + 1]
        cache.crop_to(prompt.numel())
    fused.prepare_blocks(1)


def test_chunked_prefill_and_batches_match_eager(pair):
    fused, eager = pair
    ids = torch.randint(3, 260, (PREFILL_CHUNK + 200,), generator=torch.Generator().manual_seed(5))
    fc, ec = fused.new_cache(), eager.new_cache()
    a, b = fused.forward(ids, fc, (1,)), eager.forward(ids, ec, (1,))
    assert a.logits.shape == (ids.numel(), 260) and a.hidden.shape[0] == ids.numel()
    _close(a.logits, b.logits, "chunked prefill logits")
    _close(a.hidden, b.hidden, "chunked prefill hidden states")
    rows = torch.randint(3, 260, (3, 20), generator=torch.Generator().manual_seed(6))
    fc, ec = fused.new_cache(), eager.new_cache()
    _close(fused.forward_batch(rows, fc), eager.forward_batch(rows, ec), "a batch of three rows")
    step = torch.randint(3, 260, (3, 4), generator=torch.Generator().manual_seed(7))
    _close(fused.forward_batch(step, fc), eager.forward_batch(step, ec), "a batched block after the rows")
    assert fc.get_seq_length() == 24


def test_auto_picks_the_fused_decoder_and_refusals_are_one_line(tiny_llama_dir):
    assert TargetModel.load(str(tiny_llama_dir)).weight_layout == "fused"
    assert TargetModel.load(str(tiny_llama_dir), kv_cache="dynamic").weight_layout != "fused"
    with pytest.raises(UserError, match="fused runs on the static KV cache|not for --kv-cache dynamic"):
        TargetModel.load(str(tiny_llama_dir), weight_layout="fused", kv_cache="dynamic")
    gpt2 = type("Config", (), {"get_text_config": lambda self, decoder=True: self, "model_type": "gpt2"})()
    assert "architecture 'gpt2'" in supported(gpt2)


def test_the_head_through_the_target_runs_on_the_decoders_products_and_keeps_autograd(pair):
    """`TargetModel.lm_head` (what DFlash and DSpark draft through): the same logits as the Linear on either
    kernel, its weight the target's, and the Linear's own product where gradients flow (training)."""
    fused, _ = pair
    linear = fused.model.get_output_embeddings()
    hidden = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(8))
    for products in ("mkl", "onednn", "panel"):
        fused.fused.prepare_blocks(K + 1, products)
        head = fused.lm_head
        assert head.weight is linear.weight
        with torch.inference_mode():
            _close(head(hidden), linear(hidden), f"head logits on {products}")
    trainable = hidden.clone().requires_grad_(True)
    head(trainable).sum().backward()
    assert trainable.grad is not None and trainable.grad.shape == hidden.shape
    fused.prepare_blocks(1)


def test_measured_products_choose_the_faster_and_are_recorded(tiny_qwen2_dir, tmp_path, monkeypatch):
    """--weight-layout auto: both kernels are timed on the model's own weights, the lower decode + verify kept and
    named by the layout (fused or fused+onednn), the measurement kept for run.json and remembered, so a second load
    on this machine reuses it even where a new measurement would choose the other; --compile keeps MKL."""
    from evalsuite.target.decoder import FusedDecoder

    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    target = TargetModel.load(str(tiny_qwen2_dir))
    assert target.weight_layout == "fused" and target.products == "auto"
    assert target.prepare_blocks(K + 1)
    choice = target.products_choice
    assert set(choice["candidates"]) == {"mkl", "onednn", "panel"} and choice["source"] == "measured in this run"
    assert all(set(v) == {"decode_ms", f"verify{K + 1}_ms"} for v in choice["candidates"].values())
    totals = {c: sum(v.values()) for c, v in choice["candidates"].items()}
    assert totals[choice["chosen"]] == min(totals.values())
    assert target.weight_layout == {"mkl": "fused", "onednn": "fused+onednn", "panel": "fused+panel"}[choice["chosen"]]
    assert target.fused.products == choice["chosen"]
    other = "mkl" if choice["chosen"] == "onednn" else "onednn"
    monkeypatch.setattr(FusedDecoder, "measure_products", lambda self, rows, candidates: {
        other: {"decode_ms": 1.0, f"verify{rows}_ms": 1.0}, choice["chosen"]: {"decode_ms": 9.0, f"verify{rows}_ms": 9.0}})
    again = TargetModel.load(str(tiny_qwen2_dir))
    again.prepare_blocks(K + 1)
    assert again.products_choice["source"].startswith("remembered: measured ")
    assert again.products_choice["chosen"] == choice["chosen"] and again.weight_layout == target.weight_layout
    assert TargetModel.load(str(tiny_qwen2_dir), weight_layout="fused+onednn").products == "onednn"
    assert TargetModel.load(str(tiny_qwen2_dir), compile=True).products == "mkl"
    assert TargetModel.load(str(tiny_qwen2_dir), weight_layout="fused+panel").products == "panel"
    for layout in ("fused+onednn", "fused+panel"):
        with pytest.raises(UserError, match=f"--compile with --weight-layout fused\\+{layout[6:]}"):
            TargetModel.load(str(tiny_qwen2_dir), weight_layout=layout, compile=True)


def test_a_remembered_products_choice_is_measured_again_for_a_new_build_of_the_kernels(tiny_qwen2_dir, tmp_path,
                                                                                          monkeypatch):
    """A choice made with one build of evalsuite's panels (say, before its blocks fitted an AVX2 CPU's registers)
    says nothing of the next build's speed: a new build (the CPU model, torch and the kernels' source) is timed
    again instead of reusing the old record."""
    from evalsuite.target import cpu_kernels

    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    first = TargetModel.load(str(tiny_qwen2_dir))
    first.prepare_blocks(K + 1)
    assert first.products_choice["source"] == "measured in this run"
    same = TargetModel.load(str(tiny_qwen2_dir))
    same.prepare_blocks(K + 1)
    assert same.products_choice["source"].startswith("remembered: measured ")
    monkeypatch.setattr(cpu_kernels, "build_tag", lambda: "cpu-anotherbuild")
    rebuilt = TargetModel.load(str(tiny_qwen2_dir))
    rebuilt.prepare_blocks(K + 1)
    assert rebuilt.products_choice["source"] == "measured in this run"


def test_the_native_layer_path_matches_the_python_layers_on_the_same_kernels(pair, monkeypatch):
    """With evalsuite's CPU kernels (panel products, kernel attention), decodes and blocks of a batch-1 forward run
    each layer as one C++ call (`cpu_kernels.layer`); the same forward through the Python layers on the same kernels
    gives the same logits, hidden states and greedy tokens (Llama, Qwen3's q/k norms, Qwen2's q/k/v biases)."""
    from evalsuite.target import cpu_kernels
    from evalsuite.target.decoder import FusedDecoder

    if not cpu_kernels.available():
        pytest.skip(f"CPU kernels unavailable: {cpu_kernels.reason()}")
    fused, _ = pair
    assert fused.fused.prepare_blocks(K + 1, "panel") and fused.fused.block_attention == "kernel"
    calls = []
    native_layer = cpu_kernels.layer
    monkeypatch.setattr(cpu_kernels, "layer", lambda *a, **k: calls.append(1) or native_layer(*a, **k))
    generator = torch.Generator().manual_seed(9)
    prompt = torch.randint(3, 260, (120,), generator=generator)
    blocks = [torch.randint(3, 260, (n,), generator=generator) for n in (1, 2, K + 1, 1, 5)]
    outputs = {}
    for native in (True, False):
        if not native:
            monkeypatch.setattr(FusedDecoder, "_native", lambda self, batch, rows: False)
        cache = fused.new_cache()
        fused.forward(prompt, cache, LAYERS)
        outputs[native] = [fused.forward(block, cache, LAYERS) for block in blocks]
        assert cache.get_seq_length() == prompt.numel() + sum(b.numel() for b in blocks)
    assert len(calls) == len(blocks) * len(fused.fused.layers)  # the native path ran every block, and only then
    for a, b in zip(outputs[True], outputs[False]):
        _close(a.logits, b.logits, "native logits")
        _close(a.hidden, b.hidden, "native hidden states")
        assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1))
    fused.prepare_blocks(1)
