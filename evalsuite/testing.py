"""Tiny random targets for tests and benchmarks: a byte-level tokenizer with a ChatML template and a small
Llama or Qwen3 model saved as a normal Hugging Face directory (safetensors), so every code path that loads
a real target runs unchanged on them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 4 special tokens (ids 0-3) then the 256 byte symbols (ids 4-259)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(alphabet):
        vocab[symbol] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", additional_special_tokens=["<|mask|>"])
    tokenizer.chat_template = CHATML
    return tokenizer


def tiny_config(arch: str = "llama", vocab_size: int = 260, hidden_size: int = 64, layers: int = 4,
                heads: int = 4, kv_heads: int = 2, intermediate: int = 128, max_positions: int = 2048):
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate,
                  max_position_embeddings=max_positions, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  tie_word_embeddings=False)
    if arch == "llama":
        return LlamaConfig(**common, rope_theta=10000.0)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=hidden_size // heads, rope_theta=10000.0)
    raise ValueError(f"unknown tiny arch {arch}")


def build_tiny_target(directory: str | Path, arch: str = "llama", seed: int = 0, **config_overrides) -> Path:
    """Write a random tiny target (model + byte tokenizer) to `directory` and return it."""
    directory = Path(directory)
    torch.manual_seed(seed)
    config = tiny_config(arch, **config_overrides)
    model = (LlamaForCausalLM if arch == "llama" else Qwen3ForCausalLM)(config)
    # Sharpen the output layer so that greedy choices are not near-ties and text is not uniform noise.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = 2
    model.save_pretrained(directory, safe_serialization=True)
    byte_tokenizer().save_pretrained(directory)
    return directory


def drop_chat_template(directory: str | Path) -> None:
    """Turn a saved target into a base model without a chat template (raw-id runs only)."""
    directory = Path(directory)
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
