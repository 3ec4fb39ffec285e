"""Is something else using the machine while we time? CPU pressure before a run and during every decode.

Timings on a shared machine collapse silently: another process on a 2-core machine makes a verify forward with 2
threads 25x slower (thread oversubscription), while τ is unaffected. So every run measures, without privileges:
- before it starts: how many cores other processes keep busy (`/proc/stat` over half a second, while we are idle),
  and the kernel's CPU pressure (`/proc/pressure/cpu`, "some avg10": % of time runnable tasks waited for a CPU);
- during each decode: the cores other processes used (all CPU time in `/proc/stat` minus our own, from
  `resource.getrusage`, over the decode's wall time); unknown (None) for a decode too short for /proc/stat's
  clock ticks to tell (`shortest_window_s`, 80 ms on 2 cores).
`--threads auto` uses the cores the others leave free. A decode is *contended* when other processes kept at least
`CONTENDED_CORES` cores busy on average while it ran; run.json, turns.parquet, the CLI and the report say so.
Where /proc is missing (not Linux), the load average stands in before the run and per-decode figures are None.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from evalsuite.conventions import CONTENDED_CORES

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_busy_seconds() -> tuple[float, float] | None:
    """(busy seconds, total seconds) summed over all CPUs since boot, from /proc/stat; None without it."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    values = [int(v) for v in fields[:8]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values)
    return (total - idle) / _TICKS, total / _TICKS


def _own_cpu_seconds() -> float:
    """CPU time of this process and its threads (and waited-for children)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cpu_pressure() -> float | None:
    """/proc/pressure/cpu "some avg10" (percent), or None where the kernel does not report it."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    for field in line.split():
        if field.startswith("avg10="):
            return float(field.split("=", 1)[1])
    return None


def shortest_window_s() -> float:
    """The shortest wall interval over which `Meter` can tell contention: /proc/stat counts each CPU's time in
    whole clock ticks (1/SC_CLK_TCK s, 10 ms on Linux), so over a window of w seconds its busy time is off by up to
    one tick per CPU while our own CPU time (getrusage) is exact. That error, cores ticks ÷ w, must stay below half
    of CONTENDED_CORES: 80 ms on 2 cores. A 1-token reply (EOS at once) decodes in well under a millisecond, where
    one tick alone reads as several cores busy."""
    return 2 * cores() / _TICKS / CONTENDED_CORES


class Meter:
    """Cores other processes kept busy between `start()` and `stop()` (our own CPU time subtracted); None where
    that cannot be told: no /proc/stat, or a window shorter than `shortest_s` (`DecodeMeter`)."""

    shortest_s = 0.0

    def start(self) -> None:
        self._busy = _cpu_busy_seconds()
        self._own = _own_cpu_seconds()
        self._wall = time.perf_counter()

    def stop(self) -> float | None:
        end = _cpu_busy_seconds()
        wall = time.perf_counter() - self._wall
        if end is None or self._busy is None or wall <= 0 or wall < self.shortest_s:
            return None
        others = (end[0] - self._busy[0]) - (_own_cpu_seconds() - self._own)
        return max(others / wall, 0.0)


class DecodeMeter(Meter):
    """The meter of one decode: None (unknown) where the decode was too short for /proc/stat to tell."""

    def start(self) -> None:
        self.shortest_s = shortest_window_s()
        super().start()


@dataclass
class Snapshot:
    """The machine before a run: what run.json records under `contention`."""

    cores: int
    other_cores_busy: float | None  # cores other processes kept busy over the sample (None: not measurable)
    cpu_pressure_avg10: float | None  # /proc/pressure/cpu some avg10, %
    load_average_1min: float | None
    sample_s: float

    @property
    def contended(self) -> bool:
        if self.other_cores_busy is not None:
            return self.other_cores_busy >= CONTENDED_CORES
        return self.load_average_1min is not None and self.load_average_1min >= CONTENDED_CORES

    @property
    def free_cores(self) -> int:
        busy = self.other_cores_busy if self.other_cores_busy is not None else (self.load_average_1min or 0.0)
        return max(1, min(self.cores, int(round(self.cores - busy))))

    def describe(self) -> dict:
        return {**asdict(self), "contended": self.contended, "free_cores": self.free_cores,
                "contended_cores": CONTENDED_CORES}

    def warning(self, threads: int) -> str:
        """One line when something else competes for the CPU, else ''."""
        if not self.contended:
            return ""
        busy = f"{self.other_cores_busy:.1f}" if self.other_cores_busy is not None else \
            f"load {self.load_average_1min:.1f}"
        return (f"warning: other processes keep {busy} of {self.cores} cores busy: timings and speedups measured "
                f"now are not comparable with an idle machine's (τ is unaffected); running with {threads} "
                f"thread{'s' if threads != 1 else ''}")


def snapshot(sample_s: float | None = None) -> Snapshot:
    """The machine now, sampled over `sample_s` (default 0.5 s, or $EVALSUITE_CPU_SAMPLE_S) while this process idles."""
    sample_s = float(os.environ.get("EVALSUITE_CPU_SAMPLE_S", 0.5)) if sample_s is None else sample_s
    meter = Meter()
    meter.start()
    time.sleep(sample_s)
    others = meter.stop()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return Snapshot(cores(), None if others is None else round(others, 3), cpu_pressure(), load, sample_s)


def resolve_threads(requested: int | str | None, snap: Snapshot) -> int:
    """`auto` (or None): the cores other processes leave free; a number: itself."""
    if requested in (None, "auto"):
        return snap.free_cores
    return int(requested)


def cuda_processes() -> list[dict]:
    """Other compute processes on the visible NVIDIA devices (pid, used memory), from nvidia-smi; [] without it."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) != os.getpid():
            found.append({"pid": int(parts[0]), "used_memory_mib": float(parts[1] or 0)})
    return found
