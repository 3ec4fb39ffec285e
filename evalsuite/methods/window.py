"""The sliding window of the drafters that keep a KV cache over the context (`--method-option METHOD.window=W`,
docs/methods.md §7): which cache rows a windowed drafter reads, and how its cache stays bounded.

`DraftRows` is the bookkeeping both draft caches share (EAGLE-3's `DraftKVCache`, DFlash/DSpark's
`ContextKVCache`): rows sit at absolute positions [base, length) of their `GrowableBuffer`s, row 0 holding
position `base`. Without a window `base` stays 0 and nothing here changes what a cache does. With a window W
the owner says, before every write, from which position on rows can still be read (`keep_from`); when the write
would take the cache past W + `SLACK` rows, the rows before `keep_from` are dropped (the oldest chunk, one copy
of the rest), so a windowed cache never holds more than W + SLACK rows and its buffers never grow past that
(a single write larger than the slack excepted). A window masks, it never renumbers: every row keeps the RoPE
position of its absolute position.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from evalsuite.target.buffers import GrowableBuffer

SLACK = 64  # rows a windowed cache may hold beyond W: a proposal's entries and a commit (k <= 64), or a block


class DraftRows(ABC):
    """Rows at absolute positions [base, length) of `buffers` (all along one axis, all written together)."""

    def __init__(self, window: int | None):
        if window is not None and window < 1:
            raise ValueError(f"window {window}: must be >= 1")
        self.window = window
        self.base = 0
        self.length = 0

    def new_buffer(self, axis: int, minimum: int = 64) -> GrowableBuffer:
        """A buffer for this cache: doubling, capped at W + SLACK rows under a window."""
        limit = None if self.window is None else self.window + SLACK
        return GrowableBuffer(axis=axis, minimum=minimum if limit is None else min(minimum, limit), limit=limit)

    @abstractmethod
    def buffers(self) -> list[GrowableBuffer]:
        """The owner's buffers, all indexed by the same rows."""

    @property
    def held(self) -> int:
        """Rows held: [base, length)."""
        return self.length - self.base

    def make_room(self, incoming: int, keep_from: int) -> None:
        """Before writing `incoming` rows at `length`: under a window, when they would take the cache past
        W + SLACK rows, drop the rows before `keep_from` (no read will reach them again)."""
        if self.window is None or self.held + incoming <= self.window + SLACK:
            return
        drop = min(keep_from, self.length) - self.base
        if drop > 0:
            for buffer in self.buffers():
                buffer.drop_front(drop, self.held)
            self.base += drop

    def oldest_read(self, position: int) -> int:
        """The oldest absolute position a read ending at `position` reaches: position - W + 1 (the W rows up to
        and including it) under a window, else 0."""
        return 0 if self.window is None else max(position - self.window + 1, 0)

    def read_from(self, position: int) -> int:
        """Index in the buffers of `oldest_read(position)`."""
        return max(self.oldest_read(position) - self.base, 0)

    def crop(self, length: int) -> None:
        """Roll back to `length` (never before `base`: the owner restarts the cache instead)."""
        length = min(self.length, length)
        assert length >= self.base, "cropped below the window's oldest held row"
        self.length = length

    def restart(self, position: int) -> None:
        """Forget every row; the next write goes to `position` (a windowed cache skips what it will never read)."""
        self.base = self.length = position

    def covers(self, kept: int, needed_from: int) -> bool:
        """Whether the rows [needed_from, kept) are all held, so that a new turn can keep them."""
        return self.base <= needed_from <= kept <= self.length

    def nbytes_per_row(self) -> int:
        return sum(buffer.row_bytes() for buffer in self.buffers())

    def allocated_bytes(self) -> int:
        """Bytes the buffers have allocated (capacity, not just the rows held)."""
        return sum(buffer.nbytes for buffer in self.buffers())

