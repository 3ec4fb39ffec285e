"""Decode and verify forwards captured once and replayed: the GPU path of the fused decoder (`--cuda-graphs`).

At batch 1 an 8B target's decode on a GPU is a few milliseconds of HBM reads, and launching its ~400 kernels from
Python costs as much again; gpt-fast removes that by capturing the forward in a CUDA graph. A graph fixes every
shape and address, so here:

- the target's KV cache is one `KVCache` preallocated to `capacity` positions and never reallocated; the engine's
  caches are leases of it (`PooledCache`): `new_cache()` empties it and hands out a new lease, and a stale lease
  (one handed out before the latest) refuses to be used, so no two holders can share it unknowingly;
- a block of n tokens (1 … `max_rows`, every verify size of the run) runs `FusedDecoder.forward_at`: K/V written
  by position into the whole buffers, attention over the first `span` positions under a mask built from the block's
  positions. One graph per (n, span, feature layers), spans in `SPANS` (each step uses the smallest span that holds
  its context: attention reads at most ~1.5× the live K/V, against a single graph over the whole capacity);
- `capture(layer_sets)` records every graph before anything is timed (the engine calls it after loading its
  methods); a shape met later is captured then, and counted (`late_captures`) so that run.json shows it.

Prefills (any block longer than `max_rows`, or the last-position-only logits of a prefill) run the fused decoder's
ordinary forward into the same buffers. Numerics: the same products as the fused decoder; attention over masked
columns sums in another order, so the last bits of a logit may differ (tests compare greedy tokens and logits).

Without CUDA (`graphs=False`) the same static-shape forwards run eagerly: that is how the CPU tests check this path
token for token against the fused decoder; only the capture itself needs a GPU.
"""

from __future__ import annotations

import bisect

import torch

from evalsuite.errors import UserError
from evalsuite.target.decoder import FusedDecoder
from evalsuite.target.kv_cache import KVCache

MAX_CAPTURED_CONTEXT = 131072  # the captured KV cache's size: the target's window, at most this
SPANS = (256, 1024, 2048, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536, 98304, 131072)


class PooledCache:
    """A lease of the captured path's one KV cache: the `KVCache` interface the engine uses, refused once stale."""

    def __init__(self, steps: "CapturedSteps", generation: int):
        self._steps = steps
        self._generation = generation

    @property
    def inner(self) -> KVCache:
        if self._generation != self._steps.generation:
            raise RuntimeError("this KV cache lease is stale: the captured target handed its one cache out again "
                               "(new_cache) since; a captured target holds one context at a time")
        return self._steps.cache

    @property
    def layers(self):
        return self.inner.layers

    def get_seq_length(self) -> int:
        return self.inner.get_seq_length()

    def reserve(self, length: int) -> None:
        self._steps.check_fits(length)
        self.inner  # a stale lease refuses

    def crop_to(self, length: int) -> None:
        self.inner.crop_to(length)

    def nbytes(self) -> int:
        return self.inner.nbytes()

    def fill_synthetic(self, config, batch: int, length: int, dtype, device, room: int = 0) -> None:
        if batch != 1:
            raise UserError("the captured KV cache holds one sequence; batched cost surfaces use an uncaptured "
                            "cache (TargetModel.new_cache(captured=False))")
        self.reserve(length + room)
        self.inner.crop_to(0)
        for layer in self.inner.layers:
            layer.fill_synthetic(layer.buffers()[0][:, :, :1], length)


class _Graph:
    """One captured (n, span, layers) forward: its static inputs and outputs, and the graph (None: eager)."""

    def __init__(self, ids: torch.Tensor, positions: torch.Tensor):
        self.ids = ids
        self.positions = positions
        self.graph = None
        self.logits: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None


class CapturedSteps:
    def __init__(self, decoder: FusedDecoder, config, capacity: int, max_rows: int, graphs: bool):
        if graphs and decoder.device.type != "cuda":
            raise UserError("--cuda-graphs on: CUDA graphs need --device cuda")
        self.decoder = decoder
        self.capacity = int(capacity)
        self.max_rows = int(max_rows)
        self.graphs = graphs
        self.cache = KVCache(config, chunk=None)
        like = torch.empty(1, decoder.kv_heads, 1, decoder.head_dim, dtype=decoder.embed.dtype, device=decoder.device)
        for layer in self.cache.layers:  # allocated once, at the capacity: a graph holds the addresses
            layer.reserve(self.capacity)
            layer.lazy_initialization(like, like)
            for buffer in layer.buffers():  # masked columns still multiply their V by 0: no NaN may sit there
                buffer.zero_()
        decoder.ensure_positions(self.capacity)
        self.spans = tuple(s for s in SPANS if s < self.capacity) + (self.capacity,)
        self.generation = 0
        self.entries: dict[tuple[int, int, tuple[int, ...]], _Graph] = {}
        self.late_captures = 0  # shapes first met after `capture`, i.e. possibly inside a timed decode
        self._positions = torch.arange(self.capacity, device=decoder.device)
        self._pool = torch.cuda.graph_pool_handle() if graphs else None
        self._addresses = self._buffer_addresses()

    # ---- the cache -------------------------------------------------------------------------------------------
    def new_cache(self) -> PooledCache:
        self.generation += 1
        self.cache.crop_to(0)
        return PooledCache(self, self.generation)

    def _buffer_addresses(self) -> list[int]:
        return [t.data_ptr() for layer in self.cache.layers for t in layer.buffers()]

    # ---- forwards --------------------------------------------------------------------------------------------
    def check_fits(self, length: int) -> None:
        """A one-line error for a context longer than the cache allocated before capture."""
        if length > self.capacity:
            raise UserError(f"a context of {length} tokens does not fit the captured KV cache ({self.capacity} "
                            "positions, fixed before capture); run with --cuda-graphs off")

    def takes(self, rows: int, cache: PooledCache) -> bool:
        """Whether a block of `rows` tokens after the leased `cache` runs here (else the fused decoder's ordinary
        forward)."""
        return 1 <= rows <= self.max_rows and cache.get_seq_length() + rows <= self.capacity

    def span_for(self, end: int) -> int:
        return self.spans[bisect.bisect_left(self.spans, end)]

    def forward(self, ids: torch.Tensor, cache: PooledCache, layer_ids: tuple[int, ...] = ()):
        """`ids` [1, n] after the leased cache's context; returns (logits [1, n, V], hidden or None), both fresh
        tensors (a graph's outputs are overwritten by its next replay). The cache grows by n."""
        inner = cache.inner
        rows = ids.shape[1]
        start = inner.get_seq_length()
        key = (rows, self.span_for(start + rows), tuple(layer_ids))
        entry = self.entries.get(key)
        if entry is None:
            self.late_captures += 1
            entry = self._record(*key)
        entry.ids.copy_(ids)
        entry.positions.copy_(self._positions[start:start + rows])
        if entry.graph is not None:
            entry.graph.replay()
            logits, hidden = entry.logits.clone(), None if entry.hidden is None else entry.hidden.clone()
        else:
            logits, hidden = self.decoder.forward_at(entry.ids, entry.positions, self._buffers(), key[1], key[2])
        for layer in inner.layers:
            layer.advance(rows)
        return logits, hidden

    def capture(self, layer_sets) -> int:
        """Record every (block size, span, feature layers) forward the engine can ask for; returns how many."""
        for layers in sorted({tuple(s) for s in layer_sets}):
            for span in self.spans:
                for rows in range(1, self.max_rows + 1):
                    if (rows, span, layers) not in self.entries and rows <= span:
                        self._record(rows, span, layers)
        return len(self.entries)

    def _buffers(self):
        if self._buffer_addresses() != self._addresses:  # a reallocation would leave every graph on freed memory
            raise RuntimeError("the captured KV cache was reallocated; its graphs are invalid")
        return [layer.buffers() for layer in self.cache.layers]

    def _record(self, rows: int, span: int, layers: tuple[int, ...]) -> _Graph:
        device = self.decoder.device
        # capture-time writes go to the last positions of the buffers, beyond any context that leaves room for
        # this block, so recording mid-trajectory changes no live K/V
        entry = _Graph(torch.zeros(1, rows, dtype=torch.long, device=device),
                       self._positions[self.capacity - rows:].clone())
        self.entries[(rows, span, layers)] = entry
        if not self.graphs:
            return entry
        buffers = self._buffers()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # kernels choose their workspaces before the capture
            for _ in range(2):
                self.decoder.forward_at(entry.ids, entry.positions, buffers, span, layers)
        torch.cuda.current_stream().wait_stream(side)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph, pool=self._pool):
            entry.logits, entry.hidden = self.decoder.forward_at(entry.ids, entry.positions, buffers, span, layers)
        return entry

    def describe(self) -> dict:
        return {"graphs": self.graphs, "capacity": self.capacity, "max_rows": self.max_rows,
                "spans": list(self.spans), "recorded": len(self.entries), "late_captures": self.late_captures}
