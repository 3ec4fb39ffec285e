"""Scale-out on Ray: replay trajectories on many workers (GPUs, cores or machines) into one run directory.

Unit of work: one trajectory with all its requested methods, so the paired `ar` decode and every method's
decode of a turn run on the same worker and device. Units are handed out dynamically by a Ray ActorPool;
each actor loads the target and drafters once (`Runner.load`) and writes its parts atomically into the
run directory (`RunStore`), which must be on a filesystem every node sees. A worker process that dies is
restarted by Ray (`max_restarts`) and its unit retried (`max_task_retries`); a part rewritten by a retry
replaces the old one, so the store never holds duplicates. The driver writes run.json once.

Ray is an optional extra (`pip install 'evalsuite[ray]'`); `--workers 1` never imports this module.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from evalsuite.errors import UserError

INSTALL_HINT = "pip install 'evalsuite[ray]'"
MAX_RESTARTS = 3  # per actor: a worker process killed mid-run is restarted this many times at most
MAX_TASK_RETRIES = 3  # per unit: a unit whose worker died is retried this many times at most
SHARED_CPU_WARNING = ("warning: {n} CPU workers share the cores of {hosts}: their wall-clock timings (and "
                      "speedups) are not comparable to single-worker runs; τ is unaffected")


def worker_gpus(config) -> float:
    """GPUs per worker: --gpus-per-worker, else 1 with --device cuda and 0 on cpu (fractions share a GPU)."""
    if config.gpus_per_worker is not None:
        return config.gpus_per_worker
    return 1.0 if config.device.startswith("cuda") else 0.0


def worker_threads(config) -> int:
    """torch threads per worker: --threads-per-worker, else the node's cores / --workers."""
    if config.threads_per_worker is not None:
        return config.threads_per_worker
    return max(1, (os.cpu_count() or 1) // config.workers)


def import_ray():
    try:
        import ray
    except ImportError as err:
        raise UserError(f"--workers > 1 runs on Ray, which is not installed; install it with: {INSTALL_HINT}") \
            from err
    return ray


class ReplayWorker:
    """A Ray actor: one Runner with the target and drafters loaded once; runs units by sample id."""

    def __init__(self, config, run_dir: str, threads: int, gpus: float):
        from dataclasses import replace

        from evalsuite.run.runner import Runner

        self.error: UserError | None = None
        self.runner = Runner(replace(config, threads=threads), Path(run_dir))
        if gpus:
            import ray

            ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
            self.runner.worker_device = "cuda:" + ",".join(str(i) for i in ids)  # physical ids, not cuda:0
        try:
            self.runner.load(write_config=False)
            self.runner.warm_up()
        except UserError as err:  # reported by info(), so that the driver prints it as one line
            self.error = err
        self.by_id = {t.sample_id: t for t in getattr(self.runner, "trajectories", [])}

    def info(self) -> dict:
        if self.error is not None:
            raise self.error
        return {"host": self.runner.worker_host, "device": self.runner.worker_device,
                "threads": self.runner.config.threads, "pid": os.getpid()}

    def describe(self) -> dict:
        return self.runner.describe()

    def pending_ids(self) -> list[str]:
        return [unit.trajectory.sample_id for unit in self.runner.pending_units()]

    def run_unit(self, sample_id: str) -> dict:
        """Decode one trajectory with every method, write its turns; return what the driver's bar shows: per method,
        τ's sums over the steps it recorded (`metrics.tau_sums`)."""
        from evalsuite.run.runner import Progress

        sums: dict[str, list] = {}

        def collect(info: dict) -> None:
            sums.setdefault(info["method"], []).append(info["tau_sums"])

        self.runner.refresh_stored()
        self.runner.run_unit(self.by_id[sample_id], Progress(0, collect))
        return {"sample_id": sample_id, "pid": os.getpid(),
                "tau_sums": {m: (sum(a for a, _ in v), sum(n for _, n in v)) for m, v in sums.items()}}


@dataclass
class RayRun:
    """What the driver learnt: worker facts (for run.json) and the units it ran."""

    workers: list[dict]
    pending: list[str]
    total_samples: int
    shared_cpu_hosts: list[str]


def run_on_ray(config, run_dir: Path, say: Callable[[str], None] = print,
               on_start: Callable[[RayRun], None] | None = None,
               on_unit: Callable[[dict], None] | None = None) -> RayRun:
    """Run every pending unit of `config` on `config.workers` Ray actors; returns when the store is complete.

    `on_start` gets the worker facts once the actors are loaded, `on_unit` each finished unit's summary.
    Joins the cluster at `config.ray_address` or RAY_ADDRESS, or one already initialised in this process;
    otherwise starts a local cluster sized for the workers and stops it at the end.
    """
    config.validate()
    ray = import_ray()
    from ray.util import ActorPool

    from evalsuite.config import command_line
    from evalsuite.run.runner import write_run_config
    from evalsuite.store.run_store import RunStore

    config = _absolute_paths(config)
    run_dir = Path(run_dir).resolve()
    RunStore(run_dir).prepare()
    gpus, threads = worker_gpus(config), worker_threads(config)
    started_here = _connect(ray, config, gpus, threads)
    actors = []
    try:
        worker_cls = ray.remote(ReplayWorker).options(
            num_cpus=threads, num_gpus=gpus, max_restarts=MAX_RESTARTS, max_task_retries=MAX_TASK_RETRIES)
        if config.device.startswith("cuda"):
            config.device = "cuda"  # each actor sees only its own GPU(s), as cuda:0
        actors = [worker_cls.remote(config, str(run_dir), threads, gpus) for _ in range(config.workers)]
        workers = _get(ray, [a.info.remote() for a in actors])
        description = _get(ray, actors[0].describe.remote())
        shared = _shared_cpu_hosts(workers, gpus)
        description["scaleout"] = {
            "workers": config.workers, "ray_version": ray.__version__, "ray_address": config.ray_address or
            os.environ.get("RAY_ADDRESS") or ("local" if started_here else "existing"),
            "gpus_per_worker": gpus, "threads_per_worker": threads, "shared_cpu": bool(shared),
            "shared_cpu_hosts": shared, "driver_host": socket.gethostname(),
            "worker_info": [{k: w[k] for k in ("host", "device", "threads")} for w in workers],
        }
        description["environment"]["argv"] = command_line()
        description["environment"]["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_run_config(RunStore(run_dir), config, description)
        pending = _get(ray, actors[0].pending_ids.remote())
        if shared:
            say(SHARED_CPU_WARNING.format(n=sum(w["host"] in shared for w in workers), hosts=", ".join(shared)))
        info = RayRun(workers=workers, pending=pending, total_samples=len(description["sample_ids"]), shared_cpu_hosts=shared)
        if on_start:
            on_start(info)
        pool = ActorPool(actors)
        for result in _results(ray, pool.map_unordered(lambda actor, sid: actor.run_unit.remote(sid), pending)):
            if on_unit:
                on_unit(result)
        RunStore(run_dir).compact()  # every worker is done: a finished run is a handful of files
        return info
    finally:
        for actor in actors:
            ray.kill(actor)
        if started_here:
            ray.shutdown()


def _connect(ray, config, gpus: float, threads: int) -> bool:
    """Join a cluster or start a local one; True when this call started it (and must stop it)."""
    address = config.ray_address or os.environ.get("RAY_ADDRESS")
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    if ray.is_initialized():
        return False
    if address:
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise UserError(f"--ray-address {address}: cannot join the Ray cluster ({err})") from err
        return False
    import torch

    cores = os.cpu_count() or 1
    # Declare at least what the workers ask for: oversubscribed cores still run (and are flagged as shared).
    ray.init(num_cpus=max(cores, threads * config.workers),
             num_gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0,
             include_dashboard=False, **quiet)
    available = ray.cluster_resources().get("GPU", 0)
    if gpus * config.workers > available:
        ray.shutdown()
        raise UserError(f"--workers {config.workers} x --gpus-per-worker {gpus} needs {gpus * config.workers:g} "
                        f"GPUs; this node has {available:g}")
    return True


def _shared_cpu_hosts(workers: list[dict], gpus: float) -> list[str]:
    """Hosts on which more than one CPU worker runs (they compete for cores and memory bandwidth)."""
    if gpus:
        return []
    hosts = [w["host"] for w in workers]
    return sorted({h for h in hosts if hosts.count(h) > 1})


def _results(ray, iterator):
    """Unwrap a worker's UserError into the driver's one-line error."""
    while True:
        try:
            yield next(iterator)
        except StopIteration:
            return
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, UserError):
                raise err.cause from None
            raise


def _get(ray, refs):
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, UserError):
            raise err.cause from None
        raise


def _absolute_paths(config):
    """Workers may start in another directory (or on another node): ship absolute local paths."""
    from dataclasses import replace

    def absolute(value):
        return str(Path(value).resolve()) if value and Path(value).exists() else value

    return replace(config, target=absolute(config.target), data_path=absolute(config.data_path),
                   drafters={m: absolute(p) for m, p in config.drafters.items()},
                   out=str(Path(config.out).resolve()) if config.out else config.out)
