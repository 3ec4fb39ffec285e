"""One clock for the whole harness, device-agnostic.

`mark()` notes a point in time and `seconds(start, end)` reads the interval. On CPU a mark is a
`time.perf_counter()` reading. On CUDA it is an event recorded on the current stream: marking costs no
synchronisation, and the interval is the device's own timing of the work queued between the two marks; only
reading an interval waits, for its end event. `now()` is the old synchronising wall-clock reading.
"""

from __future__ import annotations

import time

import torch


class DeviceClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._sync = torch.cuda.synchronize if self.cuda else (lambda: None)

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
