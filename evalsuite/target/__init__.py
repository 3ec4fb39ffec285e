"""The target: the model whose output is being sped up, and what its forward is made of. Layered (pyproject.toml):

- `model.py`: `TargetModel` (Hugging Face weights via safetensors, the embedded default target, weight layouts, the
  forward with hidden states), `load_chat`, `weights_hash`, `parse_device`.
- `captured.py`: on CUDA, the fused decoder's decode and verify blocks replayed from CUDA graphs over one leased
  KV cache.
- `kv_cache.py` (the static KV cache) and `decoder.py` (`FusedDecoder`, the default forward).
- `buffers.py` (`GrowableBuffer`, the one growable tensor of every cache), `chat.py` (`ChatTokenizer`: the tokenizer,
  chat template, window and stop ids) and `embedded.py` (the embedded targets shipped as packages).

Importing the package imports none of them (no torch).
"""
