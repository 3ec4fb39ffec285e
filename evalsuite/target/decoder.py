"""The target's forward pass written out: fused weights, few kernels per layer, block GEMMs on pre-packed weights.

Why not the Hugging Face modeling code for decoding: a one-token decode of a 135M model on a CPU is about 20 ms of
weight reads, and transformers' per-layer Python (mask construction, rotary module, cache API, separate q/k/v and
gate/up projections) added as much again; a block of 2 … 16 tokens multiplies few rows by every weight, where
MKL's GEMM repacks the weights on every call and costs ~2× a one-row product. Here, per layer: one RMSNorm, one
QKV product, rotary from a position table, one in-place cache write, one SDPA call (grouped-query heads folded into
the query axis, so each K/V head is read once), one output product, one RMSNorm, one gate/up product, SiLU·up, one
down product. Few-row products run on weights prepared once (`prepare_blocks`), by one of three kernels, whichever
`measure_products` finds fastest on the machine (`--weight-layout auto`): "mkl" pads verify blocks to a fixed row
count whose weights MKL packed (the padded rows come after the real ones, so causality keeps them from changing any
real row, and their K/V are cropped away before the call returns) and decodes on the plain product; "onednn" runs
every product of up to 32 rows, decodes included, on oneDNN's reordered weights, unpadded; "panel" does the same on
evalsuite's own kernel (evalsuite.target.cpu_kernels: 16-column panels, batch-invariant), and brings the own
attention kernel for decodes and verify blocks with it (`block_attention` "kernel"). On a 2-core Intel Xeon MKL's
packed GEMM held an 8-row product to ~1.6× a one-row one; on a 2-core AMD EPYC (Zen 4) MKL's few-row GEMMs ran at
a fifth of the cores' peak (8 rows 2.5× a decode) where oneDNN's ran at 1.8×, and the panel kernel read the
weights at the copy bandwidth for one row (11-12 ms for SmolLM2's 538 MB, against oneDNN's 24 ms) and at 1.35×
that for eight.

Attention of a verify block on the CPU in fp32 (2 … BLOCK_ATTENTION_ROWS rows): two batched GEMMs and a softmax
in a reused score buffer (`_block_attention`), the causal mask only on the block's own columns, and no attention
for the rows that pad a block to the packed row count. A block's folded query rows (query heads per K/V head ×
rows: 56 for an 8-token block of Qwen2.5-0.5B) make its attention compute-bound at long contexts; there the GEMMs
took 0.60–0.66× the time of SDPA's CPU flash kernel at 8k–32k (Qwen2.5-0.5B's shape, 2 threads, a
microbenchmark) and 0.87–0.91× at 4k–8k for SmolLM2's 24 rows. A one-token decode (memory-bound, where SDPA was
6–50 % faster) and prefill chunks keep SDPA.

Supported: decoder-only Llama / Mistral / Qwen2 / Qwen3 (`supported`), full attention in every layer, SiLU MLP.
Numerics: the same math as transformers' eager code in the same dtype (tests/test_decoder.py compares logits,
hidden states and greedy tokens), not the same summation order, so the last bits of a logit may differ.

Hidden-state convention (as `output_hidden_states=True`): index 0 the embedding output, index i+1 the output of
decoder layer i, the last index after the final norm.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from evalsuite.target import cpu_kernels
from evalsuite.target.captured_attention import attention_for_rows, flash_length_attention, split_attention
from evalsuite.timing import DeviceClock

_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
PREFILL_CHUNK = 1024  # rows per forward of a long prefill: bounds the mask and the MLP activations
MIN_PACKED_ROWS = 3  # blocks of 1-2 rows run on the plain product, which is cheaper there than a padded block
BLOCK_ATTENTION_ROWS = 32  # CPU blocks of 2 … this many rows attend by `_block_attention` (scores held in memory)
COMPILED_MAX_BLOCK = 16  # under --compile, decodes and verify blocks of up to this many rows run compiled
# graphs dynamo may keep for `_compiled_layers` (its default is 8): one per row count (1 … COMPILED_MAX_BLOCK) ×
# feature-layer set × torch thread count (`--threads auto` measures several) × decoder in the process (a sweep,
# a Ray worker or the test suite loads many); past the limit, fullgraph=True fails the run instead of recompiling
COMPILED_GRAPH_LIMIT = 512


# `FusedDecoder.prepare_blocks`: what multiplies the weights for few-row products (MKL's packed GEMM, oneDNN's
# blocked weights, or evalsuite's own panel kernel, evalsuite.target.cpu_kernels)
PRODUCTS = ("mkl", "onednn", "panel")
ONEDNN_MAX_ROWS = 32  # products="onednn": products of 1 … this many rows run on oneDNN's reordered weights
UNPADDED = {"onednn": ONEDNN_MAX_ROWS, "panel": cpu_kernels.MAX_ROWS}  # products of 1 … n rows on prepared weights


@torch.library.custom_op("evalsuite::mkl_packed_linear", mutates_args=())
def mkl_packed_linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      rows: int) -> torch.Tensor:
    """MKL's product on weights packed for `rows` rows (`torch.ops.mkl._mkl_linear`) as an operator torch.compile
    can trace: MKL's own has no shape function, so inductor cannot place it in a graph; this one declares its
    output shape ([rows, out]) and inductor calls it as an opaque kernel. Eager forwards call MKL's directly."""
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)


@mkl_packed_linear.register_fake
def _(x, packed, weight, bias, rows):
    return x.new_empty(x.shape[0], weight.shape[0])


def _mkl_packing_available() -> bool:
    return hasattr(torch.ops, "mkl") and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight") and \
        torch.backends.mkl.is_available()


def onednn_available() -> bool:
    """oneDNN's inner product on weights reordered once into its blocked layout (the ops inductor's weight
    prepacking uses: `mkldnn._reorder_linear_weight`, `mkldnn._linear_pointwise`)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and \
        hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def supported(model) -> str | None:
    """None when `model` (a model or its config) can run through `FusedDecoder`, else the reason it cannot."""
    cfg = getattr(model, "config", model).get_text_config(decoder=True)
    kind = getattr(cfg, "model_type", "")
    if kind not in _ARCHITECTURES:
        return f"architecture {kind!r} (fused: {', '.join(_ARCHITECTURES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act}"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(cfg, "use_sliding_window", False):
        return "sliding-window layers"
    if getattr(cfg, "sliding_window", None) and kind == "mistral":
        return "sliding-window attention"
    return None


@dataclass
class _Layer:
    norm1: torch.Tensor
    qkv: torch.Tensor  # [q + 2 kv, H]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    norm2: torch.Tensor
    gate_up: torch.Tensor  # [2 I, H]
    down: torch.Tensor
    q_norm: torch.Tensor | None  # Qwen3's per-head RMSNorm of q and k
    k_norm: torch.Tensor | None
    packed: dict | None = None  # weight name → its copy for few-row products (`FusedDecoder.prepare_blocks`)


def _fuse(rows: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack the weights of `rows` into one [Σ out, in] tensor and point each Linear at its slice (no extra copy
    stays in memory: the Hugging Face modules keep working on views of the fused storage)."""
    weight = torch.cat([m.weight.detach() for m in rows]).contiguous()
    bias = None
    if any(m.bias is not None for m in rows):
        bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)
                          for m in rows]).contiguous()
    start = 0
    for m in rows:
        end = start + m.out_features
        m.weight = torch.nn.Parameter(weight[start:end], requires_grad=False)
        if m.bias is not None:
            m.bias = torch.nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return weight, bias


def _static_widths(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The row count and the hidden and head widths of a compiled forward's inputs are constants of its graph, only
    the context length is symbolic (`compile_decode`)."""
    for tensor, dims in ((x, (1, 2)), (cos, (1, 3)), (sin, (1, 3))):
        for dim in dims:
            torch._dynamo.mark_static(tensor, dim)


class FusedDecoder:
    """A decoder-only LM's forward over evalsuite.target.kv_cache's `KVCache`, on the model's own (fused) weights."""

    def __init__(self, model):
        reason = supported(model)
        if reason is not None:
            raise ValueError(f"the fused decoder does not support {reason}")
        cfg = model.config.get_text_config(decoder=True)
        inner = model.model
        self.hidden = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or self.hidden // self.heads)
        self.groups = self.heads // self.kv_heads
        self.eps = float(cfg.rms_norm_eps)
        self.intermediate = cfg.intermediate_size
        self.layers: list[_Layer] = []
        for block in inner.layers:
            attn, mlp = block.self_attn, block.mlp
            qkv, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up, _ = _fuse([mlp.gate_proj, mlp.up_proj])
            if attn.o_proj.bias is not None or mlp.down_proj.bias is not None or mlp.gate_proj.bias is not None:
                raise ValueError("the fused decoder does not support biases outside q/k/v")
            q_norm = getattr(attn, "q_norm", None)
            k_norm = getattr(attn, "k_norm", None)
            self.layers.append(_Layer(
                norm1=block.input_layernorm.weight.detach(), qkv=qkv, qkv_bias=qkv_bias,
                o=attn.o_proj.weight.detach(), norm2=block.post_attention_layernorm.weight.detach(),
                gate_up=gate_up, down=mlp.down_proj.weight.detach(),
                q_norm=None if q_norm is None else q_norm.weight.detach(),
                k_norm=None if k_norm is None else k_norm.weight.detach()))
        self.scaling = float(inner.layers[0].self_attn.scaling)
        self.embed = model.get_input_embeddings().weight.detach()
        self.final_norm = inner.norm.weight.detach()
        self.head = model.get_output_embeddings().weight.detach()
        self.head_packed = None
        self._rotary = inner.rotary_emb
        self._cos = self._sin = None
        self.products = "mkl"  # what multiplies few-row products (`prepare_blocks`)
        self._packed_rows = 0
        self.block_rows = 0  # products="mkl": verify blocks of MIN_PACKED_ROWS … block_rows rows pad to block_rows
        self.device = self.embed.device
        # "gemm": CPU verify blocks attend by `_block_attention`, decodes by SDPA; "sdpa": every forward by SDPA (the
        # A/B in benchmarks/context_cost.py, layout suffix +sdpa); "kernel": decodes and blocks by evalsuite's CPU
        # attention kernel (evalsuite.target.cpu_kernels.attention), with the panel products (`_pack`)
        self.block_attention = "gemm" if self.device.type == "cpu" else "sdpa"
        self._scores = torch.empty(0, dtype=self.embed.dtype, device=self.device)  # `_block_attention`'s buffer
        # how `forward_at` (the captured path's static-shape forward) attends over its span: "masked-sdpa" (SDPA
        # under a boolean mask of the live columns; any device), or reading the live keys only (their count a
        # device tensor): "flash-length", "split-k" or "flash+split" (evalsuite.target.captured_attention's
        # CAPTURED_ATTENTIONS; TargetModel sets the resolved `--captured-attention`)
        self.captured_attention = "masked-sdpa"
        self._compiled = None  # `compile_decode`: decodes' and verify blocks' layers through torch.compile

    # ---- set-up ------------------------------------------------------------------------------------------
    def prepare_blocks(self, rows: int, products: str = "mkl") -> bool:
        """Get the products of verify blocks of up to `rows` rows ready once (fp32 on a CPU; elsewhere every
        product is the plain one). Returns whether prepared weights are in use.

        "mkl": every weight packed by MKL for `rows`-row products; blocks of 3 … `rows` rows pad to `rows`, one-row
        products (decodes) stay on the plain `F.linear`. "onednn": every weight reordered once into oneDNN's
        blocked layout (hinted for `rows` rows), on which every product of 1 … ONEDNN_MAX_ROWS rows runs, unpadded:
        decodes, verify blocks and drafts through the head; prefill chunks stay on `F.linear`. "panel": the same
        unpadded use of evalsuite's own kernel (evalsuite.target.cpu_kernels; batch-invariant, so a verify row's product
        equals a decode's bit for bit). Which is fastest
        depends on the CPU (`measure_products`): on a 2-core AMD EPYC (Zen 3) MKL's few-row GEMMs ran at a fifth
        of the cores' peak and its one-row product at 60 % of the copy bandwidth, where oneDNN's blocked weights
        were at the bandwidth for one row and 1.7× that for eight."""
        if products not in PRODUCTS:
            raise ValueError(f"products {products!r}: choose from {', '.join(PRODUCTS)}")
        if not self.can_prepare(products, rows):
            self._pack(None, 0)
            return False
        if (products, rows) != (self.products, self._packed_rows):
            self._pack(products, rows)
        return True

    def can_prepare(self, products: str, rows: int | None = None) -> bool:
        """Whether `products`' prepared weights exist here: fp32 on a CPU, with MKL's packing or oneDNN in torch, or
        the panel kernel built; given `rows`, also whether blocks of that many rows use them (MKL packs for
        MIN_PACKED_ROWS rows or more)."""
        if self.device.type != "cpu" or self.embed.dtype != torch.float32:
            return False
        available = {"mkl": _mkl_packing_available, "onednn": onednn_available, "panel": cpu_kernels.available}[products]()
        big_enough = rows is None or products != "mkl" or rows >= MIN_PACKED_ROWS
        return available and big_enough

    def _pack(self, products: str | None, rows: int) -> None:
        for layer in self.layers:
            layer.packed = None  # the previous copies go before the next are made
        self.head_packed = None
        self.products, self._packed_rows = products or "mkl", rows
        self.block_rows = rows if products == "mkl" else 0
        # evalsuite's own kernels come together: the panel products bring the CPU attention kernel
        if products == "panel" and self.block_attention == "gemm" and \
                cpu_kernels.attends(self.head_dim, self.groups):
            self.block_attention = "kernel"
        elif products != "panel" and self.block_attention == "kernel":
            self.block_attention = "gemm"
        if products is None:
            return
        pack = self._packer(products, rows)
        for layer in self.layers:
            layer.packed = {name: pack(getattr(layer, name)) for name in ("qkv", "o", "gate_up", "down")}
        self.head_packed = pack(self.head)
        if products == "mkl":
            for packed in [self.head_packed, *(w for layer in self.layers for w in layer.packed.values())]:
                torch._dynamo.mark_static(packed)  # constants of the compiled graphs, as the weights (`compile_decode`)

    @staticmethod
    def _packer(products: str, rows: int):
        if products == "mkl":
            return lambda weight: torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        if products == "panel":
            return cpu_kernels.pack
        return lambda weight: torch.ops.mkldnn._reorder_linear_weight(weight, rows)

    def measure_products(self, rows: int, candidates: tuple[str, ...] = PRODUCTS, repeats: int = 7,
                         sample_layers: int = 4, warmups: int = 2) -> dict[str, dict[str, float]]:
        """What a one-token decode's and a `rows`-row verify's weight products cost with each candidate, estimated
        from this machine: the products of `sample_layers` layers (every layer has the same shapes) scaled to the
        whole stack, plus the head, each (candidate, rows) timed in turn within every repeat so that drift hits all
        alike (median of `repeats`, after `warmups` rounds: freshly prepared weights are slow on first touch).
        Weights are the model's own; the candidates' prepared copies of them exist only while this runs. Returns
        {candidate: {"decode_ms": …, "verify<rows>_ms": …}} for the candidates usable here."""
        layers = [self.layers[i] for i in sorted({round(j * (len(self.layers) - 1) / max(sample_layers - 1, 1))
                                                   for j in range(sample_layers)})]
        scale = len(self.layers) / len(layers)
        weights = [(getattr(layer, name), layer.qkv_bias if name == "qkv" else None)
                   for layer in layers for name in ("qkv", "o", "gate_up", "down")]
        usable = [c for c in candidates if self.can_prepare(c)]
        generator = torch.Generator().manual_seed(0)
        inputs = {(n, w.shape[1]): torch.randn(n, w.shape[1], generator=generator).to(self.embed)
                  for n in (1, rows) for w in (self.head, *(w for w, _ in weights))}
        times: dict[tuple[str, int, str], list[float]] = {}
        clock = DeviceClock(self.device)

        def products_for(candidate: str, n: int):
            if candidate == "onednn":
                pack = self._packer("onednn", rows)
                return lambda w, b: (lambda x, p=pack(w): _onednn_linear(x, p, b))
            if candidate == "panel":
                return lambda w, b: (lambda x, p=cpu_kernels.pack(w): cpu_kernels.linear(x, p, w.shape[0], b))
            if candidate == "mkl" and n == rows and rows >= MIN_PACKED_ROWS:
                pack = self._packer("mkl", rows)
                return lambda w, b: (lambda x, p=pack(w): torch.ops.mkl._mkl_linear(x, p, w, b, rows))
            return lambda w, b: (lambda x: F.linear(x, w, b))

        with torch.inference_mode():
            prepared = {(c, n): ([products_for(c, n)(w, b) for w, b in weights], products_for(c, n)(self.head, None))
                        for c in usable for n in (1, rows)}
            for repeat in range(warmups + repeats):
                for (candidate, n), (stack, head) in prepared.items():
                    for part, calls in (("layers", stack), ("head", [head])):
                        pairs = list(zip(calls, weights if part == "layers" else [(self.head, None)]))
                        seconds, _ = clock.time(lambda pairs=pairs, n=n: [call(inputs[n, w.shape[1]])
                                                                          for call, (w, _) in pairs])
                        if repeat >= warmups:
                            times.setdefault((candidate, n, part), []).append(seconds)
        median = statistics.median
        return {c: {"decode_ms": round(1e3 * (scale * median(times[c, 1, "layers"]) + median(times[c, 1, "head"])), 3),
                    f"verify{rows}_ms": round(1e3 * (scale * median(times[c, rows, "layers"]) +
                                                     median(times[c, rows, "head"])), 3)}
                for c in usable}

    def compile_decode(self) -> None:
        """Run one-token decodes (batch 1, after at least 2 cached tokens) through torch.compile: every layer,
        the final norm and the hidden states asked for in one graph, its K/V written in place into the cache's
        preallocated buffers at a symbolic position, so a growing context does not recompile (`dynamic=True`;
        the graph is built on first use, i.e. in the untimed warm-up, and kept in inductor's on-disk cache). The
        output head stays eager. What it removes is Python's and the small ops' dispatch, ~4–8 ms
        of a CPU decode here; at long contexts most of the rest above the memory floor is attention
        (benchmarks/results/context_cost_compile_cpu.txt).

        Verify blocks of 2 … COMPILED_MAX_BLOCK rows (batch 1) run compiled too (`_compiled_layers`), so that under
        --compile a method's verify step and `ar`'s decode are made the same way: a block's attention is two
        batched GEMMs and a softmax under the causal mask (the eager block attention's math; the padded rows that
        follow the real ones are computed and dropped), its products on the packed weights through
        `mkl_packed_linear`. One graph per row count and set of feature layers (blocks padded to the packed size
        are one shape; the engine's warm-up builds every one), the context length symbolic."""
        # Only the context length varies: the weights' shapes and a forward's row count are constants of its graph
        # (with every size symbolic, a first block whose rows × heads happen to equal a width ties them by a guard)
        for layer in self.layers:
            for weight in (layer.norm1, layer.qkv, layer.qkv_bias, layer.o, layer.norm2, layer.gate_up, layer.down,
                           layer.q_norm, layer.k_norm):
                if weight is not None:
                    torch._dynamo.mark_static(weight)
        for weight in (self.embed, self.final_norm, self.head):
            torch._dynamo.mark_static(weight)
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, COMPILED_GRAPH_LIMIT)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 2 * COMPILED_GRAPH_LIMIT)
        if self._compiled is None:
            self._compiled = torch.compile(self._compiled_layers, dynamic=True, fullgraph=True)

    def _compiled_layers(self, x, keys: list[torch.Tensor], values: list[torch.Tensor], start: int, cos, sin,
                         layer_ids: tuple[int, ...]):
        """`_layers` for x.shape[1] rows at positions start …, writing into the whole K/V buffers ([1, kv_heads,
        capacity, head_dim] each) and attending over their first start + rows positions: one token by SDPA, a
        block by two GEMMs and a softmax in which row i sees the columns up to start + i."""
        rows = x.shape[1]
        end = start + rows

        def writer(k_buffer, v_buffer):
            def write(k, v):
                k_buffer[:, :, start:end].copy_(k)
                v_buffer[:, :, start:end].copy_(v)
                return k_buffer[:, :, :end], v_buffer[:, :, :end]
            return write

        attend = self._sdpa(None)
        if rows > 1:
            columns = torch.arange(end, device=x.device).view(1, end)
            allowed = columns <= (start + torch.arange(rows, device=x.device)).view(rows, 1)  # [rows, end]
            mask = allowed.repeat(self.groups, 1)  # folded row g·rows + i

            def attend(folded, keys, values):
                scores = torch.matmul(folded * self.scaling, keys.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
                weights = (scores - scores.amax(dim=-1, keepdim=True)).exp()
                return torch.matmul(weights, values) / weights.sum(dim=-1, keepdim=True)
        return self._layers(x, [writer(k, v) for k, v in zip(keys, values)], cos, sin, attend, 1, rows, layer_ids)

    def _positions(self, end: int, like: torch.Tensor) -> None:
        """The rotary tables cover positions [0, end) (grown by doubling; computed by the model's own rotary
        module, so scaling variants such as llama3 or YaRN come out as transformers computes them)."""
        if self._cos is not None and self._cos.shape[0] >= end:
            return
        size = max(end, 2 * (0 if self._cos is None else self._cos.shape[0]), 4096)
        positions = torch.arange(size, device=self.device).view(1, -1)
        cos, sin = self._rotary(like, positions)  # like: only its dtype and device are read
        half = self.head_dim // 2
        self._cos = cos[0].to(like.dtype).contiguous()
        # rotate_half(x)·sin == cat(x2, x1)·(−sin1, sin2): the sign folded into the table
        self._sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1).to(like.dtype).contiguous()

    # ---- products ----------------------------------------------------------------------------------------
    def _linear(self, x: torch.Tensor, weight: torch.Tensor, packed, bias: torch.Tensor | None = None):
        rows = x.shape[0] * x.shape[1]
        if packed is not None and self.products in UNPADDED:
            if rows <= UNPADDED[self.products]:
                flat = x.reshape(rows, x.shape[-1])
                out = _onednn_linear(flat, packed, bias) if self.products == "onednn" else \
                    cpu_kernels.linear(flat, packed, weight.shape[0], bias)
                return out.view(x.shape[0], x.shape[1], -1)
        elif packed is not None and rows == self.block_rows:
            flat = x.reshape(rows, x.shape[-1])
            product = mkl_packed_linear if torch.compiler.is_compiling() else torch.ops.mkl._mkl_linear
            out = product(flat, packed, weight, bias, rows)
            return out.view(x.shape[0], x.shape[1], -1)
        return F.linear(x, weight, bias)

    @torch.inference_mode()
    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head over `hidden` [..., H] on this decoder's few-row products: what a drafter that predicts
        through the target's head (DFlash, DSpark) multiplies its slots with, made as the verify's head is."""
        flat = hidden.reshape(1, -1, self.hidden)
        return self._linear(flat, self.head, self.head_packed).view(*hidden.shape[:-1], -1)

    # ---- the forward -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, layer_ids: tuple[int, ...] = (), last_only: bool = False,
                logits: bool = True):
        """`ids` [batch, n] after the cached context (equal lengths); returns (logits [batch, n or 1, V] in the
        model dtype or None, hidden [batch, n, len(layer_ids), H] or None). The cache grows by n."""
        batch, n = ids.shape
        if n > PREFILL_CHUNK:
            outs = [self.forward(ids[:, i:i + PREFILL_CHUNK], cache, layer_ids, last_only,
                                 logits=logits and (not last_only or i + PREFILL_CHUNK >= n))
                    for i in range(0, n, PREFILL_CHUNK)]
            hidden = None if not layer_ids else torch.cat([h for _, h in outs], dim=1)
            if not logits:
                return None, hidden
            return (outs[-1][0] if last_only else torch.cat([o for o, _ in outs], dim=1)), hidden
        pad = 0
        if batch == 1 and self.block_rows and MIN_PACKED_ROWS <= n < self.block_rows:
            pad = self.block_rows - n  # repeat the last token: rows after the real ones change none of them
            ids = torch.cat([ids, ids[:, -1:].expand(1, pad)], dim=1)
        start = cache.get_seq_length()
        rows = n + pad
        end = start + rows
        x = F.embedding(ids, self.embed)
        self._positions(end, x)
        cos = self._cos[start:end].view(1, rows, 1, self.head_dim)
        sin = self._sin[start:end].view(1, rows, 1, self.head_dim)
        graph = self._compiled if rows <= COMPILED_MAX_BLOCK else None
        if graph is not None and batch == 1 and start >= 2 and all(layer.is_initialized for layer in cache.layers):
            cache.reserve(end)  # --compile: the layers write into the whole preallocated K/V buffers
            buffers = [layer.buffers() for layer in cache.layers]
            _static_widths(x, cos, sin)
            x, hidden = graph(x, [k for k, _ in buffers], [v for _, v in buffers], start, cos, sin, tuple(layer_ids))
            for layer in cache.layers:
                layer.advance(rows)
            if pad:
                cache.crop_to(start + n)
            return self._outputs(x, hidden, n, logits, last_only)
        if self._native(batch, rows) and all(layer.is_initialized for layer in cache.layers):
            cache.reserve(end)  # each layer is one call of evalsuite's CPU kernels, writing into the K/V buffers
            buffers = [layer.buffers() for layer in cache.layers]
            shape = (self.heads, self.kv_heads, self.intermediate)
            cos, sin = cos.view(rows, self.head_dim), sin.view(rows, self.head_dim)

            def step(index, layer, x):
                keys, values = buffers[index]
                weights = {**layer.packed, "norm1": layer.norm1, "norm2": layer.norm2, "qkv_bias": layer.qkv_bias,
                           "q_norm": layer.q_norm, "k_norm": layer.k_norm}
                return cpu_kernels.layer(x.view(rows, self.hidden), weights, keys, values, start, cos, sin, shape,
                                         self.eps, self.scaling).view(1, rows, self.hidden)
            x, hidden = self._layers(x, None, cos, sin, None, batch, rows, layer_ids, step)
            for layer in cache.layers:
                layer.advance(rows)
            if pad:
                cache.crop_to(start + n)
            return self._outputs(x, hidden, n, logits, last_only)
        if self.block_attention == "kernel" and cpu_kernels.attends(self.head_dim, self.groups * rows):
            def attend(folded, keys, values):
                return cpu_kernels.attention(folded, keys, values, rows, self.scaling)
        elif rows == 1:
            attend = self._sdpa(None)
        elif self.block_attention == "gemm" and rows <= BLOCK_ATTENTION_ROWS and x.dtype == torch.float32:
            # within the block, row i sees its columns 0 … i (every row sees all the cached columns before it)
            own = torch.ones(n, rows, dtype=torch.bool, device=self.device).tril()
            bias = torch.zeros(n, rows, dtype=x.dtype, device=self.device).masked_fill_(~own, float("-inf"))
            attend = self._block_attention(bias.repeat(self.groups, 1), batch * self.kv_heads, rows, n, end)
        else:  # query row i (absolute start + i) sees key columns 0 … start + i; folded rows g·rows + i
            allowed = torch.arange(end, device=self.device).view(1, end) <= \
                torch.arange(start, end, device=self.device).view(rows, 1)
            attend = self._sdpa(allowed.repeat(self.groups, 1))
        x, hidden = self._layers(x, [layer.update for layer in cache.layers], cos, sin, attend, batch, rows,
                                 layer_ids)
        if pad:
            cache.crop_to(start + n)
        return self._outputs(x, hidden, n, logits, last_only)

    def _outputs(self, x, hidden, n: int, logits: bool, last_only: bool):
        """(logits of the first `n` rows, or of row n - 1 only, or None; hidden states of those rows)."""
        if hidden is not None:
            hidden = hidden[:, :n]
        if not logits:
            return None, hidden
        if last_only:
            return self._linear(x[:, n - 1:n], self.head, self.head_packed), hidden
        return self._linear(x, self.head, self.head_packed)[:, :n], hidden

    @torch.inference_mode()
    def forward_at(self, ids: torch.Tensor, positions: torch.Tensor, buffers: list[tuple[torch.Tensor, torch.Tensor]],
                   span: int, layer_ids: tuple[int, ...] = ()):
        """A block `ids` [1, n] at the absolute `positions` ([n] on the device) with every shape fixed by (n, span)
        and no Python value taken from the context: each layer's K/V go into its whole preallocated cache buffers
        (`buffers`: (K, V) of [1, kv_heads, capacity, head_dim]) by `index_copy_`, attention reads their first
        `span` positions under a mask built from `positions`, rotary rows are gathered from the table (grown to the
        capacity beforehand, `ensure_positions`). So a CUDA graph can capture it once per (n, span) and replay it
        at any context up to `span` (evalsuite.target.captured). Returns (logits [1, n, V], hidden or None); the caller
        moves the cache's length."""
        rows = ids.shape[1]
        x = F.embedding(ids, self.embed)
        cos = self._cos.index_select(0, positions).view(1, rows, 1, self.head_dim)
        sin = self._sin.index_select(0, positions).view(1, rows, 1, self.head_dim)
        attention = attention_for_rows(self.captured_attention, rows)
        if attention == "flash-length":
            attend = flash_length_attention(positions, rows, span, self.scaling, self.kv_heads, self.groups)
        elif attention == "split-k":
            def attend(folded, keys, values):
                return split_attention(folded, keys, values, positions, self.scaling)
        else:
            columns = torch.arange(span, device=positions.device).view(1, span)
            attend = self._sdpa((columns <= positions.view(rows, 1)).repeat(self.groups, 1))

        def writer(keys: torch.Tensor, values: torch.Tensor):
            def write(k, v):
                keys.index_copy_(2, positions, k)
                values.index_copy_(2, positions, v)
                return keys[:, :, :span], values[:, :, :span]
            return write

        x, hidden = self._layers(x, [writer(k, v) for k, v in buffers], cos, sin, attend, 1, rows, layer_ids)
        return self._linear(x, self.head, self.head_packed), hidden

    # ---- attention: (folded queries [batch, kv_heads, groups·rows, dim], keys, values) → the same shape -----
    def _sdpa(self, mask: torch.Tensor | None):
        def attend(folded, keys, values):
            return F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=self.scaling)
        return attend

    def _block_attention(self, bias: torch.Tensor, heads: int, rows: int, real: int, end: int):
        """Softmax attention of a block of `rows` tokens whose K/V are the last `rows` of `end` columns, for
        `heads` = batch × K/V heads and the first `real` rows only (the padded rows after them get zeros: their
        outputs are dropped, and causality keeps them out of every real row): scores = q·Kᵀ·scale in one buffer
        reused by every layer, `bias` [groups·real, rows] (0 / −inf) added to the block's own columns, the softmax
        taken in place, then P·V. The math of transformers' eager attention, in another summation order than
        SDPA's."""
        groups, dim = self.groups, self.head_dim
        size = heads * groups * real * end
        if self._scores.numel() < size:
            self._scores = torch.empty(size, dtype=bias.dtype, device=self.device)
        scores = self._scores[:size].view(heads, groups * real, end)
        own = scores[:, :, end - rows:]

        def attend(folded, keys, values):
            query = folded.view(heads, groups, rows, dim)[:, :, :real].reshape(heads, groups * real, dim)
            torch.bmm(query * self.scaling, keys.reshape(heads, end, dim).transpose(1, 2), out=scores)
            own.add_(bias)
            scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
            total = scores.sum(dim=-1, keepdim=True)
            out = torch.bmm(scores, values.reshape(heads, end, dim)).div_(total)
            if real == rows:
                return out.view(folded.shape)
            padded = folded.new_zeros(heads, groups, rows, dim)
            padded[:, :, :real] = out.view(heads, groups, real, dim)
            return padded.view(folded.shape)
        return attend

    def ensure_positions(self, end: int) -> None:
        """Rotary rows for positions [0, end), in the model dtype (before a capture: `forward_at` only gathers)."""
        self._positions(end, self.embed[:1])

    def _native(self, batch: int, rows: int) -> bool:
        """Whether a forward of `rows` tokens runs each layer as one call of evalsuite's CPU kernels
        (`cpu_kernels.layer`): the panel products and the kernel attention in use, batch 1, a block they take."""
        return (self.block_attention == "kernel" and self.products == "panel" and batch == 1
                and rows <= cpu_kernels.MAX_ROWS and cpu_kernels.attends(self.head_dim, self.groups * rows)
                and self.layers[0].packed is not None)

    def _layers(self, x, writers, cos, sin, attend, batch: int, rows: int, layer_ids: tuple[int, ...], step=None):
        """Every decoder layer and the final norm; `writers[i](k, v)` stores layer i's new K/V and returns the K/V
        to attend over, `attend(folded, keys, values)` is the forward's attention (or `step(i, layer, x)` runs layer
        i whole). Returns (x, hidden [batch, rows, len(layer_ids), H] or None)."""
        wanted = {j + 1: None for j in layer_ids}
        if 0 in wanted:
            wanted[0] = x
        last_layer = len(self.layers)
        for index, layer in enumerate(self.layers):
            x = step(index, layer, x) if step is not None else \
                self._layer(x, layer, writers[index], cos, sin, attend, batch, rows)
            if index + 1 in wanted and index + 1 != last_layer:
                wanted[index + 1] = x
        x = F.rms_norm(x, (self.hidden,), self.final_norm, self.eps)
        if last_layer in wanted:
            wanted[last_layer] = x
        hidden = torch.stack([wanted[j + 1] for j in layer_ids], dim=2) if layer_ids else None
        return x, hidden

    def _layer(self, x, layer: _Layer, write, cos, sin, attend, batch: int, rows: int):
        heads, kv_heads, dim, groups = self.heads, self.kv_heads, self.head_dim, self.groups
        packed = layer.packed or {}
        h = F.rms_norm(x, (self.hidden,), layer.norm1, self.eps)
        qkv = self._linear(h, layer.qkv, packed.get("qkv"), layer.qkv_bias)
        q_width, kv_width = heads * dim, kv_heads * dim
        v = qkv[..., q_width + kv_width:].view(batch, rows, kv_heads, dim)
        if layer.q_norm is None:
            qk = qkv[..., :q_width + kv_width].view(batch, rows, heads + kv_heads, dim)
            qk = self._rotate(qk, cos, sin)
            q, k = qk[:, :, :heads], qk[:, :, heads:]
        else:
            q = F.rms_norm(qkv[..., :q_width].view(batch, rows, heads, dim), (dim,), layer.q_norm, self.eps)
            k = F.rms_norm(qkv[..., q_width:q_width + kv_width].view(batch, rows, kv_heads, dim), (dim,),
                           layer.k_norm, self.eps)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        keys, values = write(k.transpose(1, 2), v.transpose(1, 2))
        # query head kv·groups + g → row g·rows + i of KV head kv: each K/V head is read once
        folded = q.reshape(batch, rows, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(
            batch, kv_heads, groups * rows, dim)
        out = attend(folded, keys, values)
        out = out.view(batch, kv_heads, groups, rows, dim).permute(0, 3, 1, 2, 4).reshape(batch, rows, q_width)
        x = x + self._linear(out, layer.o, packed.get("o"))
        h = F.rms_norm(x, (self.hidden,), layer.norm2, self.eps)
        gate_up = self._linear(h, layer.gate_up, packed.get("gate_up"))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return x + self._linear(F.silu(gate) * up, layer.down, packed.get("down"))

    def _rotate(self, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        swapped = torch.cat([t[..., half:], t[..., :half]], dim=-1)
        return torch.addcmul(t * cos, swapped, sin)
