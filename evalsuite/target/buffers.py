"""One growable buffer for every cache in the harness: the target's KV cache (evalsuite.target.kv_cache) and the
drafters' own KV caches (evalsuite.methods.draft_layers, evalsuite.methods.eagle3).

A `GrowableBuffer` is a tensor preallocated along one axis; writes go in place and return views of the filled
part, so no forward copies the cache; rollback is the owner's length moving back. It grows by whole chunks
(`chunk`, for a cache reserved before a timed decode) or by doubling (`chunk=None`, for caches that follow the
context one step at a time), copying what it holds once per growth. A windowed draft cache gives it a `limit`:
doubling stops there (a single write may still need more), and the owner makes room by `drop_front`, forgetting
the oldest rows, instead of growing (`evalsuite.methods.window`).
"""

from __future__ import annotations

import torch


class GrowableBuffer:
    def __init__(self, axis: int, chunk: int | None = None, minimum: int = 64, limit: int | None = None):
        self.axis = axis
        self.chunk = chunk
        self.minimum = minimum
        self.limit = limit  # doubling never passes it (only a write larger than it does)
        self.data: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return 0 if self.data is None else self.data.shape[self.axis]

    def ensure(self, like: torch.Tensor, size: int, keep: int) -> None:
        """Room for `size` rows along the axis, shaped and typed like `like` elsewhere; the first `keep` rows stay."""
        if size <= self.capacity:
            return
        if self.chunk:
            capacity = -(-size // self.chunk) * self.chunk
        else:
            capacity = max(size, 2 * self.capacity, self.minimum)
            if self.limit is not None:
                capacity = max(size, min(capacity, self.limit))
        shape = list(like.shape)
        shape[self.axis] = capacity
        grown = like.new_empty(shape)
        if self.data is not None and keep:
            grown.narrow(self.axis, 0, keep).copy_(self.data.narrow(self.axis, 0, keep))
        self.data = grown

    def write(self, start: int, rows: torch.Tensor) -> torch.Tensor:
        """Write `rows` at [start, start + n) along the axis (growing first if needed, keeping [0, start)); returns
        the view of [0, start + n)."""
        end = start + rows.shape[self.axis]
        self.ensure(rows, end, keep=start)
        self.data.narrow(self.axis, start, rows.shape[self.axis]).copy_(rows)
        return self.view(end)

    def drop_front(self, rows: int, filled: int) -> None:
        """Forget the first `rows` of the `filled` ones: rows [rows, filled) move to [0, filled - rows)."""
        kept = filled - rows
        if rows <= 0 or kept <= 0 or self.data is None:
            return
        moved = self.data.narrow(self.axis, rows, kept).clone()  # source and destination may overlap
        self.data.narrow(self.axis, 0, kept).copy_(moved)

    def view(self, length: int) -> torch.Tensor:
        return self.data.narrow(self.axis, 0, length)

    def row_bytes(self) -> int:
        """Bytes per position along the axis."""
        if self.data is None:
            return 0
        return self.data.numel() // max(self.capacity, 1) * self.data.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes allocated (the whole capacity)."""
        return 0 if self.data is None else self.data.nbytes
