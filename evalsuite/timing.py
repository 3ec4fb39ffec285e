"""One clock for the whole harness, device-agnostic: every timing of the target's or a drafter's work reads it (the
engine's decode loop and prefill, `evalsuite profile`'s cost surfaces, the plan's cost estimate, the benchmarks).

`mark()` notes a point in time and `seconds(start, end)` reads the interval. On CPU a mark is a
`time.perf_counter()` reading. On CUDA it is an event recorded on the current stream: marking costs no
synchronisation, and the interval is the device's own timing of the work queued between the two marks; only
reading an interval waits, for its end event. `time(fn)` times one call from an idle device (synchronised first,
so nothing queued before it is counted). `now()` is the old synchronising wall-clock reading.

`wall()` is the host's clock for intervals that are not a device's work: a whole sweep, a time limit, an engine
in another process (vLLM's requests, timed from here as they come back).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def wall() -> float:
    """Seconds on the host's monotonic clock; only differences mean anything."""
    return time.perf_counter()


class DeviceClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._sync = partial(torch.cuda.synchronize, device) if self.cuda else (lambda: None)

    def now(self) -> float:
        """Seconds; on CUDA the device is synchronised first so that the reading covers finished work."""
        self._sync()
        return time.perf_counter()

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    def time(self, fn: Callable[[], T]) -> tuple[float, T]:
        """(seconds, fn()) of one call, started on an idle device: the interval holds fn's work alone."""
        self._sync()
        start = self.mark()
        result = fn()
        return self.seconds(start, self.mark()), result
