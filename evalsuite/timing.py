"""One clock for the whole harness: wall time read after the device has finished its queued work."""

from __future__ import annotations

import time

import torch


class DeviceClock:
    def __init__(self, device: torch.device):
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def now(self) -> float:
        """Seconds; on CUDA the device is synchronised first so that the reading covers finished work."""
        self._sync()
        return time.perf_counter()
