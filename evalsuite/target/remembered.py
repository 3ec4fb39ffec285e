"""A measured choice of the engine's set-up (thread count, product kernels), remembered per machine and set-up.

Both are measured on the machine a run starts on, and both decide its timings; two runs of one machine must be
timed the same way to be merged, so a choice is kept under evalsuite's cache dir, keyed by what it depends on
(host, CPU, torch, target weights, …), and a later run of the same set-up reuses it; its record says so, with the
original measurement. Delete `<cache>/<kind>/` to measure again."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from typing import Callable

from evalsuite.target.embedded import cache_root


def remembered_choice(kind: str, key: dict, measure: Callable[[], dict], valid: Callable[[dict], bool]) -> dict:
    """`measure()`'s result ({"chosen": …, …}) for `key`, measured once and remembered under `<cache>/<kind>/`;
    `valid(choice)` says whether a remembered one can still be used. The result gains "source": measured in this
    run, or remembered (with when it was measured)."""
    record = cache_root() / kind / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24] + ".json")
    try:
        saved = json.loads(record.read_text())
        if saved.get("key") == key and valid(saved["choice"]):
            return {**saved["choice"], "source": f"remembered: measured {saved['measured_at']} on this set-up"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    choice = measure()
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "choice": choice}, indent=1))
        tmp.replace(record)
    except OSError:  # a read-only cache: measured each run, said so
        return {**choice, "source": "measured in this run (not remembered: the cache dir is not writable)"}
    return {**choice, "source": "measured in this run"}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform says."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
