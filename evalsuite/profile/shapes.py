"""The shape catalogue of `evalsuite profile`: the published configurations of released models (hidden sizes, depths,
heads, vocabularies, windows), a target of such a shape (or of a config.json, or of a model directory's config) with
random weights at the requested dtype and the weight layout the engine would use, and the real text its drafters
look up in. Nothing is downloaded: the cost of a forward depends on the shape, not on the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evalsuite.bundled import require_bundled
from evalsuite.errors import UserError
from evalsuite.profile.memory import check_weights_fit
from evalsuite.target import embedded
from evalsuite.target.model import (DEFAULT_TARGET, TargetModel, auto_products, parse_device, resolve_target_path,
                                    resolve_weight_layout, use_column_major_linears)

# Published configurations of the released models (hidden sizes, depths, heads, vocabularies, windows); random
# weights are built from these, nothing is downloaded.
SHAPES: dict[str, tuple[str, dict]] = {
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                                   max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True)),
    "qwen3-8b": ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=131072,
                               rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "qwen3-4b": ("qwen3", dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=131072,
                               rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                                   max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 8192})),
    "qwen2.5-coder-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                         max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                                         tie_word_embeddings=True)),
    # toy sizes for tests: deep enough for every drafter's distinct feature layers
    "tiny": ("qwen3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=12, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=131072,
                           rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)),
}
SHAPE_ALIASES = {"default": "smollm2-135m", "smollm2": "smollm2-135m"}


def shape_config(name: str):
    """A transformers config for a named shape or a config.json path."""
    from transformers import AutoConfig, CONFIG_MAPPING

    key = SHAPE_ALIASES.get(name, name)
    if key in SHAPES:
        model_type, fields = SHAPES[key]
        config = CONFIG_MAPPING[model_type](**fields, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        return config, key
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"--target-shape {name}: not a named shape ({', '.join(sorted(SHAPES))}) nor a config.json")
    try:
        fields = json.loads(path.read_text())
        model_type = fields.pop("model_type")
        config = AutoConfig.for_model(model_type, **{k: v for k, v in fields.items()
                                                     if k not in ("architectures", "auto_map", "transformers_version")})
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"--target-shape {name}: not a usable model config.json ({err})") from None
    return config, str(path)


def random_target(config, name: str, device: str = "cpu", dtype: torch.dtype = torch.float32,
                  weight_layout: str = "auto", tokenizer=None, model_dir: str | None = None,
                  compile: bool = False, kv_cache: str = "static", cuda_graphs: str = "off") -> TargetModel:
    """A `TargetModel` of this config with random weights (seed 0) and the weight layout the engine would use;
    the byte tokenizer of `evalsuite.testing` when no tokenizer is given (real text in any vocabulary > 260).
    `cuda_graphs` off by default: the cost surfaces time batched forwards, which are not captured."""
    from transformers import AutoModelForCausalLM

    from evalsuite.testing import byte_tokenizer

    dev = parse_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible; use --device cpu")
    layout = resolve_weight_layout(weight_layout, dev, compile, config, kv_cache)
    check_weights_fit(config, name, dev, dtype, layout)
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = config.eos_token_id if config.eos_token_id is not None else 2
    if layout.startswith("column-major"):
        use_column_major_linears(model, onednn_blocks=layout == "column-major+onednn")
    return TargetModel(model, tokenizer or byte_tokenizer(), name, model_dir or f"random:{name}", dev, dtype,
                       weight_layout=layout, kv_cache=kv_cache, compile=compile, cuda_graphs=cuda_graphs,
                       products=auto_products(weight_layout, layout))


def parse_dtype(dtype: str | None, device: str) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise UserError(f"--dtype {dtype}: expected one of float32, bfloat16, float16")
    if device.startswith("cpu") and table[dtype] != torch.float32:
        raise UserError(f"--dtype {dtype}: only float32 is supported on CPU")
    return table[dtype]


def build_target(target: str | None, target_shape: str | None, device: str, dtype: str | None,
                 weight_layout: str = "auto") -> TargetModel:
    """`--target-shape NAME|config.json`, or `--target default|DIR` (its config and tokenizer; weights random)."""
    torch_dtype = parse_dtype(dtype, device)
    if target_shape:
        config, name = shape_config(target_shape)
        return random_target(config, name, device, torch_dtype, weight_layout)
    from transformers import AutoConfig, AutoTokenizer

    spec = target or DEFAULT_TARGET
    path = resolve_target_path(spec)
    if not Path(path).is_dir():
        raise UserError(f"--target {spec}: profile reads a local model directory (or use --target-shape)")
    config = AutoConfig.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    entry = embedded.lookup(spec)
    name = entry.name if entry is not None else spec
    return random_target(config, name, device, torch_dtype, weight_layout, tokenizer, path)


def real_text_ids(target: TargetModel, length: int) -> list[int]:
    """GSM8K questions and answers, then MT-Bench questions (the bundled data), tokenized and repeated to
    `length` tokens: what the model-free drafters look up in."""
    data = require_bundled("tasks", "the bundled task data", "run from a source checkout")
    texts = []
    for line in (data / "gsm8k" / "test.jsonl").read_text().splitlines():
        record = json.loads(line)
        texts.append(f"Question: {record['question']}\nAnswer: {record.get('answer', '')}\n")
    for line in (data / "mt_bench" / "question.jsonl").read_text().splitlines():
        texts.extend(json.loads(line)["turns"])
    ids: list[int] = []
    for text in texts:
        ids.extend(target.tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(ids) >= length:
            break
    while len(ids) < length:
        ids = ids + ids
    return ids[:length]
