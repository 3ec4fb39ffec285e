"""The target model: load, prefill, verify a block, expose hidden states, roll back the KV cache.

Hidden-state convention (HF `output_hidden_states=True`): index 0 is the embedding output, index i+1 the
output of decoder layer i, and the last index is the output *after* the final norm. Every drafter names
"target layer id j" and reads `hidden_states[j + 1]` (see docs/methods.md), so `forward(layer_ids=...)`
takes layer ids in that convention.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from evalsuite.config import CACHE_KINDS, CUDA_GRAPHS, PRODUCTS_OF_LAYOUT, WEIGHT_LAYOUTS, compile_conflict
from evalsuite.errors import UserError
from evalsuite.hashing import file_sha256
from evalsuite.target import cpu_kernels, embedded
from evalsuite.target.captured import MAX_CAPTURED_CONTEXT, CapturedSteps, PooledCache
from evalsuite.target.captured_attention import resolve_captured_attention
from evalsuite.target.chat import ChatTokenizer
from evalsuite.target.decoder import COMPILED_MAX_BLOCK, PRODUCTS, FusedDecoder, onednn_available, supported
from evalsuite.target.kv_cache import ATTENTION, DynamicKVCache, KVCache, check_supported
from evalsuite.target.remembered import cpu_model, remembered_choice

DEFAULT_TARGET = "default"
DEFAULT_TARGET_NAME = embedded.EMBEDDED[embedded.DEFAULT_KEY].name
cache_root = embedded.cache_root


def resolve_target_path(spec: str) -> str:
    """An embedded target's key (`default`, `qwen2.5-coder-0.5b`; evalsuite/embedded.py) → its converted
    safetensors directory; an existing directory → itself; anything else → an HF hub id."""
    entry = embedded.lookup(spec)
    if entry is not None:
        return str(embedded.ensure_converted(entry))
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise UserError(f"--target {spec}: no config.json there; point it at a Hugging Face model directory")
        return str(path)
    if spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1:
        raise UserError(f"--target {spec}: no such directory")
    return spec


def weights_hash(model_dir: str) -> str:
    """sha256 over the safetensors files (name + content hash), or 'hub:<id>' when no local dir."""
    path = Path(model_dir)
    if not path.is_dir():
        return f"hub:{model_dir}"
    files = sorted(path.glob("*.safetensors"))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode())
        digest.update(file_sha256(f).encode())
    return digest.hexdigest()


def cached_weights_hash(model_dir: str) -> str:
    """`weights_hash`, remembered under evalsuite's cache dir (hashing 0.5 GB takes seconds), keyed by the model
    directory and its safetensors files' names, sizes and mtimes; never written into the model directory, which
    may be read-only or shared."""
    path = Path(model_dir)
    if not path.is_dir():
        return weights_hash(model_dir)
    path = path.resolve()
    stamp = ";".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in sorted(path.glob("*.safetensors")))
    record = cache_root() / "weights-sha256" / f"{hashlib.sha256(str(path).encode()).hexdigest()[:24]}.json"
    try:
        saved = json.loads(record.read_text())
        if saved.get("path") == str(path) and saved.get("stamp") == stamp:
            return saved["sha256"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    digest = weights_hash(str(path))
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(path), "stamp": stamp, "sha256": digest}))
        tmp.replace(record)
    except OSError:
        pass  # an unwritable cache only costs the hash next time
    return digest


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [n, V] float32
    hidden: torch.Tensor | None  # [n, len(layer_ids), H] target dtype, or None when no layers were asked for


def _from_chat(attribute: str) -> property:
    """A read-only attribute of the target that its `ChatTokenizer` holds."""
    return property(lambda self: getattr(self.chat, attribute), doc=f"`self.chat.{attribute}`")


class TargetModel:
    """A causal LM with a growable, croppable KV cache. The engine decodes at batch 1 (`forward`); `forward_batch`
    runs equal-length rows for the cost surfaces."""

    def __init__(self, model, tokenizer, name: str, model_dir: str, device: torch.device, dtype: torch.dtype,
                 weight_layout: str = "row-major", kv_cache: str = "static", compile: bool = False,
                 cuda_graphs: str = "auto", products: str | None = None, captured_attention: str = "auto"):
        self.model = model.eval()
        self.device = device
        self.dtype = dtype
        cfg = model.config
        self.config = cfg
        self.num_layers: int = cfg.num_hidden_layers
        self.hidden_size: int = cfg.hidden_size
        eos = model.generation_config.eos_token_id if model.generation_config else None
        self.chat = ChatTokenizer(tokenizer, name, model_dir, max_context=_window(cfg),
                                  vocab_size=model.get_output_embeddings().weight.shape[0],
                                  stop_ids=_stop_ids(eos, tokenizer))
        if kv_cache == "static":
            check_supported(cfg)
            if cfg._attn_implementation == "sdpa":
                model.set_attn_implementation(ATTENTION)
        conflict = compile_conflict(weight_layout, cuda_graphs) if compile else None
        if conflict:
            raise UserError(conflict)
        self.compile = compile
        # "fused…": evalsuite.target.decoder's own forward (fused weights, prepared block products); the HF modules
        # stay usable
        self.fused = FusedDecoder(model) if weight_layout.startswith("fused") else None
        # what multiplies the fused decoder's few-row products: mkl | onednn | panel, or auto (measured by
        # `prepare_blocks`; oneDNN's and the panel kernel's prepared weights cannot be compiled, so --compile keeps MKL)
        self.products = products or PRODUCTS_OF_LAYOUT.get(weight_layout, "mkl")
        if compile and self.products == "auto":
            self.products = "mkl"
        self.products_choice: dict | None = None  # the measurement behind an "auto" choice (run.json)
        self.attention_lanes_choice: dict | None = None  # the CPU attention's lane form for verify blocks (run.json)
        self._fused_head = _FusedHead(model.get_output_embeddings(), self.fused) if self.fused is not None else None
        if compile and self.fused is not None:  # its decodes and verify blocks as compiled graphs (`compile_decode`)
            self.fused.compile_decode()
            if cuda_graphs == "auto":
                cuda_graphs = "off"
        # the HF decoder under torch.compile with dynamic shapes: one graph for one-token decodes and one for verify
        # blocks (sizes 0 and 1 are specialised), the context length symbolic in both; compiled on first use, i.e.
        # in the untimed warm-up
        self._compiled_decoder = torch.compile(model.model, dynamic=True) if compile and self.fused is None else None
        self.weight_layout = weight_layout  # as `load` resolved it; "row-major" is the weights as loaded
        if cuda_graphs not in CUDA_GRAPHS:
            raise UserError(f"--cuda-graphs {cuda_graphs}: choose from {', '.join(CUDA_GRAPHS)}")
        if cuda_graphs == "on" and (device.type != "cuda" or self.fused is None):
            raise UserError("--cuda-graphs on: needs --device cuda and the fused decoder (--weight-layout auto or "
                            "fused)")
        # decode and verify forwards replayed from CUDA graphs (evalsuite.target.captured), set up by `prepare_blocks`
        self.cuda_graphs = "on" if cuda_graphs == "on" or (
            cuda_graphs == "auto" and device.type == "cuda" and self.fused is not None) else "off"
        self.captured: CapturedSteps | None = None
        # how the captured forwards attend (evalsuite.target.captured_attention; None without CUDA graphs)
        self.captured_attention: str | None = None
        if self.cuda_graphs == "on":
            self.set_captured_attention(captured_attention)
        self.kv_cache = kv_cache  # "static": evalsuite.target.kv_cache (preallocated, GQA-folded attention); "dynamic": HF's

    def set_captured_attention(self, choice: str) -> str:
        """Resolve `--captured-attention` here and hand it to the fused decoder; the captured forwards take it
        when their graphs are recorded (`prepare_blocks` / `prepare_layers`), so set it before those."""
        self.captured_attention = resolve_captured_attention(choice, self.device, self.dtype)
        self.fused.captured_attention = self.captured_attention
        return self.captured_attention

    # ---- loading -----------------------------------------------------------------------------------------
    @classmethod
    def load(cls, spec: str = DEFAULT_TARGET, device: str = "cpu", dtype: str | None = None,
             weight_layout: str = "auto", kv_cache: str = "static", compile: bool = False,
             cuda_graphs: str = "auto", captured_attention: str = "auto") -> "TargetModel":
        """`weight_layout`: the forward and how its Linear weights are stored and multiplied ("auto": the fused
        decoder where it supports the model, else transformers' decoder with column-major plus oneDNN block
        kernels on CPU, as loaded elsewhere; `resolve_weight_layout`, `use_column_major_linears`). `kv_cache`:
        "static" (the preallocated cache and GQA-folded attention of evalsuite.target.kv_cache) or "dynamic" (transformers'
        DynamicCache and SDPA, the engine before it). `compile`: torch.compile for the fused decoder's one-token
        decodes (`FusedDecoder.compile_decode`), or for the HF decoder's decode and verify forwards where the
        fused one does not apply (on CPU "auto" then resolves to column-major, since oneDNN's opaque tensors
        cannot be compiled). `captured_attention`: how the CUDA-graph forwards attend over their span (auto: the
        fastest exact one that runs there; evalsuite.target.captured_attention)."""
        dev = parse_device(device)
        if weight_layout not in WEIGHT_LAYOUTS:
            raise UserError(f"--weight-layout {weight_layout}: choose from {', '.join(WEIGHT_LAYOUTS)}")
        if kv_cache not in CACHE_KINDS:
            raise UserError(f"--kv-cache {kv_cache}: choose from {', '.join(CACHE_KINDS)}")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is visible; use --device cpu")
        torch_dtype = _parse_dtype(dtype, dev)
        path = resolve_target_path(spec)
        _check_local_weights(spec, path)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, use_safetensors=True)
        except SafetensorError as err:
            raise UserError(f"--target {spec}: a safetensors file there is unreadable ({err}); re-download the "
                            "model") from None
        except OSError as err:
            if not Path(path).exists():
                raise UserError(
                    f"--target {spec}: cannot load from the Hugging Face hub (offline or unknown id); "
                    "download it elsewhere and pass the local directory"
                ) from err
            raise UserError(f"--target {spec}: {str(err).splitlines()[0]}") from err
        entry = embedded.lookup(spec)
        name = entry.name if entry is not None else spec
        model = model.to(dev)
        if weight_layout == "fused":
            reason = supported(model) or ("--kv-cache dynamic" if kv_cache == "dynamic" else None)
            if reason is not None:
                raise UserError(f"--weight-layout fused: not for {reason}; use --weight-layout auto")
        if weight_layout == "fused+onednn" and (dev.type != "cpu" or torch_dtype != torch.float32
                                                or not onednn_available()):
            raise UserError("--weight-layout fused+onednn: oneDNN's products run on a CPU in float32 with a torch "
                            "built with oneDNN; use --weight-layout auto")
        if weight_layout == "fused+panel" and (dev.type != "cpu" or torch_dtype != torch.float32 or not cpu_kernels.available()):
            why = cpu_kernels.reason() if dev.type == "cpu" and torch_dtype == torch.float32 else "it runs on a CPU in float32"
            raise UserError(f"--weight-layout fused+panel: {why}; use --weight-layout auto")
        layout = resolve_weight_layout(weight_layout, dev, compile, model, kv_cache)
        if layout.startswith("column-major"):
            use_column_major_linears(model, onednn_blocks=layout == "column-major+onednn")
        return cls(model, tokenizer, name, path, dev, torch_dtype, layout, kv_cache, compile, cuda_graphs,
                   auto_products(weight_layout, layout), captured_attention)

    # ---- what the chat tokenizer knows -----------------------------------------------------------------------
    tokenizer = _from_chat("tokenizer")
    name = _from_chat("name")
    model_dir = _from_chat("model_dir")
    max_context = _from_chat("max_context")
    vocab_size = _from_chat("vocab_size")
    stop_ids = _from_chat("stop_ids")
    chat_template = _from_chat("chat_template")

    def render(self, messages: list[dict], tools: list[dict] | None = None, enable_thinking: bool = False) -> list[int]:
        return self.chat.render(messages, tools, enable_thinking)

    def decode(self, ids) -> str:
        return self.chat.decode(ids)

    # ---- forward passes ----------------------------------------------------------------------------------
    def prepare_blocks(self, rows: int, attention_lanes: int | None = None) -> bool:
        """Get verify blocks of up to `rows` tokens ready before any timed forward (the fused decoder packs its
        weights for that many rows once; blocks of 3 … rows tokens pad to it; with CUDA graphs, the one KV cache
        is allocated for the window and blocks of 1 … rows tokens are captured by `prepare_layers`). Returns
        whether packing is used. With products "auto" (`--weight-layout auto`) the fused decoder's product kernels are
        chosen here, by measuring both on this machine (`choose_products`); `weight_layout` then names the choice.
        Where verify blocks attend with evalsuite's CPU attention kernel and its 8- and 16-lane forms differ for this
        block, the faster form here is measured (or remembered) and set (`cpu_kernels.choose_attention_lanes`), or
        `attention_lanes` is kept (a resumed run's first part chose it); `attention_lanes_choice` says which."""
        if self.cuda_graphs == "on" and (self.captured is None or self.captured.max_rows != rows):
            self.captured = CapturedSteps(self.fused, self.config, min(self.max_context, MAX_CAPTURED_CONTEXT) + rows,
                                          rows, graphs=True)
        if self.fused is None:
            return False
        products = self.products
        if products == "auto":
            self.products_choice = self.choose_products(rows)
            products = self.products_choice["chosen"] if self.products_choice else "mkl"
        used = self.fused.prepare_blocks(rows, products)
        self.weight_layout = {v: k for k, v in PRODUCTS_OF_LAYOUT.items()}[self.fused.products] if used else "fused"
        fused = self.fused
        if fused.block_attention == "kernel":
            if attention_lanes is not None:
                self.attention_lanes_choice = {"chosen": cpu_kernels.attention_lanes(attention_lanes),
                                               "source": "kept from the run's first part"}
            else:
                self.attention_lanes_choice = cpu_kernels.choose_attention_lanes(fused.kv_heads, fused.groups, rows,
                                                                                 fused.head_dim)
        return used

    def prepare_drafter(self, module: torch.nn.Module) -> str:
        """Put a drafter's own products on the kernels this target's decoder runs on, after `prepare_blocks`: with
        the panels chosen (`fused+panel`) each of the drafter's nn.Linear becomes a `PanelLinear` (its 1 … 32-row
        products on the panels, the rest on `F.linear`); otherwise nothing changes. The target's own modules that a
        drafter holds (its lm_head, embeddings) are left alone: they already run on the decoder's products. A draft
        attention module that declares `kernel_attention` (EAGLE-3's over its KV cache; the block drafters' block
        attention) is switched to evalsuite's CPU attention kernel where the decoder attends with it. Returns what
        the drafter's products run on ("panel", "panel+attention" or "torch"), for run.json."""
        if self.fused is None or self.fused.products != "panel" or self.device.type != "cpu" \
                or self.dtype != torch.float32:
            return "torch"
        own = {p.data_ptr() for p in self.model.parameters()}
        kernel_attention = self.fused.block_attention == "kernel"
        attends = False
        for sub in module.modules():
            if type(sub) is torch.nn.Linear and sub.weight.dtype == torch.float32 \
                    and sub.weight.data_ptr() not in own:
                PanelLinear.convert(sub)
            if kernel_attention and hasattr(sub, "kernel_attention"):  # a draft attention that can use the kernel
                sub.kernel_attention = attends = True
        return "panel+attention" if attends else "panel"

    def choose_products(self, rows: int) -> dict | None:
        """MKL, oneDNN or the panel kernel for the fused decoder's products of 1 … `rows` rows, whichever gives the
        lowest decode + verify-`rows` time of the weight products measured here (`FusedDecoder.measure_products`);
        None where there is nothing to choose (not a CPU in fp32, or fewer than two of them usable here). The
        choice names each kernel left out and why. Remembered per machine, torch, model shape, row count, thread
        count, set of usable kernels and build of evalsuite's own (`remembered_choice`), so runs of one machine use
        the same kernels, and a new build of the panels is measured again."""
        fused = self.fused
        usable = [c for c in PRODUCTS if fused.can_prepare(c, rows)]
        if len(usable) < 2:
            return None
        key = {"host": socket.gethostname(), "cpu": cpu_model(), "torch": torch.__version__, "dtype": str(self.dtype),
               "shape": [fused.hidden, fused.intermediate, len(fused.layers), fused.heads, fused.kv_heads,
                         fused.head_dim, self.vocab_size], "rows": rows, "threads": torch.get_num_threads(),
               "candidates": usable, "kernels": cpu_kernels.build_tag() if "panel" in usable else None}
        unusable = {c: (cpu_kernels.reason() if c == "panel" else "unavailable in this torch") for c in PRODUCTS
                    if c not in usable}

        def measure() -> dict:
            fused.prepare_blocks(0)  # no prepared copies of the weights beside the candidates' while they are timed
            measured = fused.measure_products(rows, tuple(usable))
            return {"candidates": measured, "chosen": min(measured, key=lambda c: sum(measured[c].values())),
                    "rule": f"lowest decode + verify-{rows} time of the weight products (four layers scaled to all "
                            f"{len(fused.layers)}, plus the head; median of 7, the candidates in turn)"}
        choice = remembered_choice("products-choice", key, measure, lambda saved: saved["chosen"] in usable)
        return {**choice, "unusable": unusable} if unusable else choice

    @contextlib.contextmanager
    def eager(self):
        """Forwards without the --compile graphs inside this block (nothing is compiled in it): inductor's C++
        kernels keep the OpenMP thread count they were built with, so a thread-count measurement must not be the
        one that builds them."""
        fused = self.fused._compiled if self.fused is not None else None
        hf = self._compiled_decoder
        if self.fused is not None:
            self.fused._compiled = None
        self._compiled_decoder = None
        try:
            yield self
        finally:
            if self.fused is not None:
                self.fused._compiled = fused
            self._compiled_decoder = hf

    def prepare_layers(self, layer_sets) -> int:
        """Capture, before anything is timed, the block forwards that return each set of feature layers (one set
        per method); returns the number of captured forwards (0 without CUDA graphs)."""
        return self.captured.capture(layer_sets) if self.captured is not None else 0

    def new_cache(self, captured: bool = True) -> KVCache | DynamicKVCache | PooledCache:
        """An empty KV cache of the kind chosen (`--kv-cache`); caches reserve (`reserve`) and roll back
        (`crop_to`) themselves. With CUDA graphs: a lease of the one captured cache (the previous lease goes
        stale), unless `captured=False` (batched cost surfaces)."""
        if captured and self.captured is not None:
            return self.captured.new_cache()
        return KVCache(self.config) if self.kv_cache == "static" else DynamicKVCache(config=self.config)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, cache: KVCache | DynamicKVCache, layer_ids: tuple[int, ...] = (), last_only: bool = False
    ) -> ForwardOutput:
        """Run `input_ids` ([n] on device) after the cached context; the cache grows by n.

        `layer_ids` uses the drafters' convention (layer j → hidden_states[j+1]). `last_only` returns the
        logits of the last position only (prefill).
        """
        ids = input_ids.view(1, -1)
        if isinstance(cache, PooledCache):
            steps = self.captured
            steps.check_fits(cache.get_seq_length() + ids.shape[1])
            if not last_only and steps.takes(ids.shape[1], cache):
                logits, hidden = steps.forward(ids, cache, tuple(layer_ids))
                return ForwardOutput(logits=logits[0].float(), hidden=None if hidden is None else hidden[0])
        if self.fused is not None:
            logits, hidden = self.fused.forward(ids, cache, tuple(layer_ids), last_only)
            return ForwardOutput(logits=logits[0].float(), hidden=None if hidden is None else hidden[0])
        want_hidden = bool(layer_ids)
        decoder = self.model.model
        if self._compiled_decoder is not None and ids.shape[1] <= COMPILED_MAX_BLOCK and cache.get_seq_length():
            decoder = self._compiled_decoder
        out = decoder(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=want_hidden)
        last = out.last_hidden_state[0]
        if last_only:
            last = last[-1:]
        logits = self.model.lm_head(last).float()
        hidden = None
        if want_hidden:
            states = out.hidden_states
            hidden = torch.stack([states[j + 1][0] for j in layer_ids], dim=1)
        return ForwardOutput(logits=logits, hidden=hidden)

    @torch.inference_mode()
    def forward_batch(self, input_ids: torch.Tensor, cache: KVCache | DynamicKVCache) -> torch.Tensor:
        """Run `input_ids` ([batch, n] on device) after a cached context of the same length in every row
        (uniform lengths: no padding); every row of the cache grows by n. Returns the logits [batch, n, V] in
        float32. Used by the cost surfaces (evalsuite.profile); the engine's decode path is `forward`, batch 1."""
        if self.fused is not None:
            return self.fused.forward(input_ids, cache)[0].float()
        decoder = self.model.model
        if self._compiled_decoder is not None and input_ids.shape[1] <= COMPILED_MAX_BLOCK and \
                cache.get_seq_length():
            decoder = self._compiled_decoder
        out = decoder(input_ids=input_ids, cache=cache, use_cache=True)
        return self.model.lm_head(out.last_hidden_state).float()

    @property
    def embed_tokens(self) -> torch.nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Module:
        """The output head (its `weight` is the target's); with the fused decoder, inference through it runs on the
        decoder's few-row products (`FusedDecoder.head_logits`), as the verify's head does."""
        return self._fused_head if self._fused_head is not None else self.model.get_output_embeddings()

    def check_layer_ids(self, layer_ids: tuple[int, ...], who: str) -> None:
        # -1 is the embedding output (hidden_states[0]), which DeepSpec's configs may name
        bad = [j for j in layer_ids if not -1 <= j < self.num_layers]
        if bad:
            raise UserError(f"{who} reads target layers {bad}, but the target has only {self.num_layers} layers "
                            f"(valid ids: -1 for the embeddings, 0..{self.num_layers - 1})")


def load_chat(spec: str = DEFAULT_TARGET) -> ChatTokenizer:
    """The target's tokenizer, template, window and stop ids, without loading its weights (engines that run the
    target elsewhere, e.g. vLLM, and tools that only rebuild contexts)."""
    path = resolve_target_path(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
    except OSError as err:
        if not Path(path).exists():
            raise UserError(f"--target {spec}: cannot load from the Hugging Face hub (offline or unknown id); "
                            "download it elsewhere and pass the local directory") from err
        raise UserError(f"--target {spec}: {str(err).splitlines()[0]}") from err
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        eos = None
    entry = embedded.lookup(spec)
    name = entry.name if entry is not None else spec
    return ChatTokenizer(tokenizer, name, path, max_context=_window(config), vocab_size=int(config.vocab_size),
                         stop_ids=_stop_ids(eos, tokenizer))


def _window(config) -> int:
    return int(getattr(config, "max_position_embeddings", 8192))


def _stop_ids(eos, tokenizer) -> frozenset[int]:
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    return frozenset([eos] if isinstance(eos, int) else (eos or []))


def parse_device(device: str) -> torch.device:
    """`cpu` or `cuda[:N]` (a visible device), else a one-line UserError."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"--device {device}: use cpu or cuda[:N]") from None
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"--device {device}: use cpu or cuda[:N]")
    if dev.type == "cuda" and torch.cuda.is_available() and (dev.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return dev


def resolve_weight_layout(layout: str, device: torch.device, compile: bool = False, model=None,
                          kv_cache: str = "static") -> str:
    """"auto": the fused decoder wherever it supports the model (any device), else the Hugging Face decoder with
    the layout that is fastest on the device."""
    if layout != "auto":
        return layout
    if model is not None and kv_cache == "static" and supported(model) is None:
        return "fused"
    if device.type != "cpu":
        return "row-major"
    return "column-major+onednn" if torch.backends.mkldnn.is_available() and not compile else "column-major"


def auto_products(requested: str, layout: str) -> str | None:
    """"auto" (the fused decoder's product kernels measured by `TargetModel.prepare_blocks`) when --weight-layout
    auto resolved to the fused decoder; None (as the layout says) otherwise."""
    return "auto" if requested == "auto" and layout == "fused" else None


def use_column_major_linears(model: torch.nn.Module, onednn_blocks: bool = False) -> None:
    """Store every nn.Linear weight transposed ([in, out] contiguous) behind its usual [out, in] view.

    Same values and the same `F.linear` call, but on CPU MKL's fp32 x·W' with the transposed storage streams
    the weights faster than x·Wᵀ for the few-row products of decoding (benchmarks/verify_cost.py: a one-token
    forward 1.34× faster). With `onednn_blocks` a oneDNN copy of the weight also serves 2 … 16-row products,
    where oneDNN beats MKL (verify blocks; see `OneDnnBlockLinear`). A weight tied to an embedding gets its own
    copy, so embedding rows stay contiguous.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            weight = module.weight
            module.weight = torch.nn.Parameter(weight.detach().t().contiguous().t(),
                                               requires_grad=weight.requires_grad)
            if onednn_blocks and module.weight.dtype == torch.float32:
                OneDnnBlockLinear.convert(module)


class OneDnnBlockLinear(torch.nn.Linear):
    """An nn.Linear whose 2 … MAX_ROWS-row products (a verify block) run on oneDNN, the rest on `F.linear`.

    Why: on CPU, MKL's fp32 GEMM costs about one weight pass per row for few rows, so a 4-token verify forward
    cost 1.8× a one-token decode; oneDNN's inner product handles 2–16 rows in little more than one pass.
    One-row products (decoding) stay on MKL, which is faster there; prefills (many rows) too. Inference only:
    with autograd on, or for other dtypes, it is a plain nn.Linear.
    """

    MAX_ROWS = 16

    @classmethod
    def convert(cls, module: torch.nn.Linear) -> None:
        module.__class__ = cls
        # plain attributes, not buffers: oneDNN tensors must stay out of state_dict() and .to()
        module.__dict__["onednn_weight"] = module.weight.detach().contiguous().to_mkldnn()
        module.__dict__["onednn_bias"] = None if module.bias is None else module.bias.detach().to_mkldnn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not 2 <= rows <= self.MAX_ROWS or torch.is_grad_enabled() or x.dtype != torch.float32:
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1]).contiguous().to_mkldnn()
        out = torch.ops.aten.mkldnn_linear(flat, self.onednn_weight, self.onednn_bias).to_dense()
        return out.view(*x.shape[:-1], out.shape[-1])


class PanelLinear(torch.nn.Linear):
    """An nn.Linear whose 1 … `cpu_kernels.MAX_ROWS`-row products run on evalsuite's panel kernel (the products the
    target's fused decoder uses under `fused+panel`), the rest on `F.linear`. For a drafter's own layers and heads
    (`TargetModel.prepare_drafter`): their one- and few-row products are where MKL runs at a fraction of the
    bandwidth on some CPUs. Inference only: with autograd on, or for other dtypes, it is a plain nn.Linear; if the
    weight is changed in place (training), the panels are rebuilt before the next product."""

    @classmethod
    def convert(cls, module: torch.nn.Linear) -> None:
        module.__class__ = cls
        module._pack()

    def _pack(self) -> None:
        # plain attributes, not buffers: the panels stay out of state_dict() and .to()
        self.__dict__["panels"] = cpu_kernels.pack(self.weight.detach())
        self.__dict__["packed_version"] = self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not 1 <= rows <= cpu_kernels.MAX_ROWS or torch.is_grad_enabled() or x.dtype != torch.float32 \
                or x.device.type != "cpu":
            return super().forward(x)
        if self.weight._version != self.packed_version:
            self._pack()
        return cpu_kernels.linear(x.contiguous(), self.panels, self.out_features, self.bias)


class _FusedHead(torch.nn.Module):
    """`TargetModel.lm_head` over the fused decoder: the same weight; its products those of the decoder's verify
    blocks outside autograd, the Linear's own where gradients flow (training)."""

    def __init__(self, linear: torch.nn.Linear, fused: FusedDecoder):
        super().__init__()
        self.linear = linear
        self.__dict__["fused"] = fused  # not a submodule

    def __getattr__(self, name: str):  # weight, bias, in_features, out_features: the Linear's
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["linear"], name)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (hidden.requires_grad or self.linear.weight.requires_grad):
            return self.linear(hidden)
        return self.fused.head_logits(hidden)


def _check_local_weights(spec: str, path: str) -> None:
    """A local target must hold safetensors weights: pickled ones (*.bin, *.pt) are never loaded."""
    directory = Path(path)
    if not directory.is_dir() or any(directory.glob("*.safetensors")):
        return
    pickled = sorted(p.name for pattern in ("*.bin", "*.pt", "*.pth", "*.ckpt") for p in directory.glob(pattern))
    hint = f" (found {', '.join(pickled[:3])}: pickled weights are never loaded; convert them to safetensors)" \
        if pickled else ""
    raise UserError(f"--target {spec}: no *.safetensors weights there{hint}")


def _parse_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.float32  # fp32 everywhere by default: bf16 prefill is ~7x slower on this kind of CPU
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise UserError(f"--dtype {dtype}: expected one of float32, bfloat16, float16")
    if device.type == "cpu" and table[dtype] != torch.float32:
        raise UserError(f"--dtype {dtype}: only float32 is supported on CPU")
    return table[dtype]
