"""`evalsuite concurrency`: trajectories kept in flight through vLLM at several levels; throughput, per-request ITL
and speedup against vLLM's own `ar` at each level.

It is a mode of the one pipeline, not a second runner: `runner.Runner.load` prepares everything exactly as for
`evalsuite run --engine vllm` (the task's trajectories, the replay mode and context policy, the chat template, one
vLLM engine per method with prefix caching), and each turn's context comes from the runner's own replay
(`Runner._replays`: replay mode, context policy, closed loop). What differs is only the schedule and what is
recorded: instead of one turn at a time, `level` trajectories are in flight at once. A trajectory's next turn is
submitted when its previous turn finishes (its history then holds that reply, or the logged one, as the replay mode
says), and a new trajectory is admitted when one ends, so each vLLM engine batches up to `level` requests
continuously. The same trajectories, turns and seeds run for every (method, level), each starting with an empty
prefix cache (a level must not find the previous level's prompts cached; within a measurement the cache works as in
serving, across a trajectory's turns). The result is one table, `concurrency.csv`, one row per (method, level), and
a run.json.

Per row: output tokens and the wall time from the first request to the last (`throughput_tok_s`; the drain at
the end, when fewer than `level` trajectories are left, is included); per request the mean inter-token latency
(first → last token ÷ (tokens − 1), from the engine core's timestamps) and its P50/P95 over requests; the time to
first token P50 (queueing included); τ from vLLM's per-request step counts; and, against `ar` at the same level,
`speedup_throughput` (tokens/s ÷ ar's) and `speedup_itl` (ar's ITL P50 ÷ this ITL P50: the per-user gain).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from evalsuite import metrics, timing
from evalsuite.config import RunConfig, portable_paths
from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError
from evalsuite.replay import MethodReplay
from evalsuite.run.runner import Runner, turn_seed
from evalsuite.store.run_store import SCHEMAS

COLUMNS = ["engine", "method", "concurrency", "trajectories", "requests", "output_tokens", "wall_s",
           "throughput_tok_s", "itl_ms_p50", "itl_ms_p95", "ttft_ms_p50", "tau", "speedup_throughput",
           "speedup_itl"]


def run_concurrency(config: RunConfig, levels: list[int], out_dir: Path,
                    log: Callable[[str], None] = print) -> pd.DataFrame:
    if config.engine != "vllm":
        raise UserError("--engine hf decodes one stream at a time; keeping requests in flight needs --engine vllm "
                        "(for our engine's batch costs see `evalsuite profile`)")
    if not levels or min(levels) < 1:
        raise UserError("--concurrency: give levels >= 1, e.g. 1,4,16")
    from evalsuite.engines.vllm_engine import VllmEngine

    config.validate()
    out_dir = Path(out_dir)
    engine = VllmEngine(config, out_dir, max_num_seqs=max(levels))
    runner = Runner(config, out_dir, engine)
    try:
        runner.load(write_config=False)
        _drop_empty_tables(out_dir)
        log(f"{len(runner.trajectories)} trajectories; methods {', '.join(runner.methods)}; levels "
            f"{', '.join(map(str, levels))}")
        warm = runner.chat.render([{"role": "user", "content": "Warmup."}], None)
        for name in engine.workers:  # untimed: the first requests of an engine pay its set-up
            sweep(runner, name, min(max(levels), 2), warm_only=warm)
        rows = []
        for level in sorted(levels):
            for name in runner.methods:
                row = sweep(runner, name, level)
                rows.append(row)
                log(f"  {name:<8} in flight {level:>3}: {row['throughput_tok_s']:8.1f} tok/s  ITL P50 "
                    f"{row['itl_ms_p50']:7.1f} ms  P95 {row['itl_ms_p95']:7.1f} ms  τ {row['tau']:.2f}")
        table = with_speedups(pd.DataFrame(rows))
        table = table[COLUMNS]
        table.to_csv(out_dir / "concurrency.csv", index=False)
        described = runner.describe()
        described.update(kind="concurrency", concurrency_levels=sorted(levels), max_num_seqs=max(levels),
                         prefix_cache="on within a measurement; emptied before every (method, level)",
                         columns={"itl": "per request: (last − first token) ÷ (tokens − 1), engine-core clock; "
                                         "P50/P95 over requests", "throughput": "output tokens ÷ wall time from "
                                         "the first request to the last (drain included)",
                                  "speedup_throughput": "tokens/s ÷ vLLM ar's at the same level",
                                  "speedup_itl": "vLLM ar's ITL P50 ÷ this ITL P50"})
        tmp = out_dir / ".run.json.tmp"
        tmp.write_text(json.dumps(portable_paths(described), indent=1, default=str))  # no machine paths
        os.replace(tmp, out_dir / "run.json")
        return table
    finally:
        engine.close()


def sweep(runner: Runner, method: str, level: int, warm_only: list[int] | None = None) -> dict:
    """Every trajectory through `method`'s engine with `level` of them in flight; one row of measures."""
    worker = runner.engine.workers[method]
    cfg = runner.config
    if warm_only is not None:
        for i in range(level):
            worker.submit(f"warm-{i}", list(warm_only), 8, i)
        for _ in range(level):
            worker.poll()
        return {}
    queue = list(range(len(runner.trajectories)))
    replays: dict[int, MethodReplay] = {}
    active: dict[str, tuple[int, int]] = {}
    done: list[dict] = []

    def submit_turn(index: int, turn: int) -> bool:
        """Submit the trajectory's next turn that is not skipped; False when it has no more turns."""
        replay = replays[index]
        trajectory = runner.trajectories[index]
        while replay.has_turn(turn):
            context = replay.context(turn)
            if context.skipped:
                replay.record_reply(turn, None)
                turn += 1
                continue
            limit = min(cfg.max_new_tokens, runner.chat.max_context - len(context.ids))
            request = f"{level}:{index}:{turn}"
            worker.submit(request, list(context.ids), limit, turn_seed(cfg.seed, trajectory.sample_id, turn))
            active[request] = (index, turn)
            return True
        return False

    def admit() -> None:
        while len({i for i, _ in active.values()}) < level and queue:
            index = queue.pop(0)
            trajectory = runner.trajectories[index]
            replays[index] = runner.replays(trajectory, (method,))[method]  # the run's own replay of it
            submit_turn(index, 0)

    if not worker.reset_prefix_cache():  # the same prompts ran at the previous level: start every level cold
        raise RuntimeError(f"vLLM ({method}) did not empty its prefix cache; levels would not be comparable")
    started = timing.wall()
    admit()
    while active:
        reply = worker.poll()
        index, turn = active.pop(reply["id"])
        done.append(reply)
        replays[index].record_reply(turn, runner.chat.decode([int(i) for i in reply["output_ids"]]))
        if not submit_turn(index, turn + 1):
            admit()
    return measures(done, timing.wall() - started, method, level, len(runner.trajectories))


def measures(done: list[dict], wall: float, method: str, level: int, trajectories: int) -> dict:
    tokens = sum(len(r["output_ids"]) for r in done)
    itl, ttft, steps = [], [], []
    for reply in done:
        stamps = reply.get("timing") or {}  # the engine core's timestamps of this request
        n = len(reply["output_ids"])
        if stamps and n > 1:
            itl.append(1e3 * (stamps["last_token_ts"] - stamps["first_token_ts"]) / (n - 1))
        if stamps:
            ttft.append(1e3 * (stamps["first_token_ts"] - stamps["queued_ts"]))
        steps += reply.get("steps") or []
    percentile = (lambda values, q: float(np.percentile(values, q)) if values else float("nan"))
    return {"engine": "vllm", "method": method, "concurrency": level, "trajectories": trajectories,
            "requests": len(done), "output_tokens": tokens, "wall_s": wall,
            "throughput_tok_s": tokens / wall if wall > 0 else float("nan"),
            "itl_ms_p50": percentile(itl, 50), "itl_ms_p95": percentile(itl, 95), "ttft_ms_p50": percentile(ttft, 50),
            "tau": metrics.tau_of([int(s["num_accepted"]) for s in steps],
                                  [bool(s.get("budget_limited", False)) for s in steps])}


def with_speedups(table: pd.DataFrame) -> pd.DataFrame:
    """Against `ar` at the same level: throughput ratio and the ITL P50 ratio (NaN where ar did not run)."""
    base = table[table.method == BASELINE].set_index("concurrency")
    table = table.copy()
    table["speedup_throughput"] = [row.throughput_tok_s / base.throughput_tok_s.get(row.concurrency, np.nan)
                                   for row in table.itertuples()]
    table["speedup_itl"] = [base.itl_ms_p50.get(row.concurrency, np.nan) / row.itl_ms_p50
                            for row in table.itertuples()]
    return table


def _drop_empty_tables(out_dir: Path) -> None:
    """The run store's table folders that `Runner.load` prepared: a concurrency sweep writes its own table."""
    for table in SCHEMAS:
        folder = out_dir / f"{table}.parquet"
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
