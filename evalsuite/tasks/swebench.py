"""SWE-bench: agent trajectories replayed one assistant message per turn, or instances / ready-made prompts as
one turn. docs/swebench.md describes the settings and what each measures.

`--subset`:
- `mini-swe-agent` (default): 30 SWE-bench Verified runs of mini-swe-agent v1.15 with gemini-3-pro
  (34-86 messages; system, task, then action/observation pairs with observations as user messages);
- `mini-swe-agent-long`: 12 more runs of the same mini-swe-agent set, held out of the training trajectories,
  whose logged contexts pass 20k tokens of the 32k target's tokenizer (8 repositories; the long-context study,
  benchmarks/long_context_study.sh);
- `swe-agent`: SWE-agent `.traj` files (its `history`, including in-context demonstrations and, in the
  function-calling demo, OpenAI tool calls with `tool` observations);
- `lite` | `verified` | `full`: SWE-bench instance rows, read with the `swebench` package's
  `load_swebench_dataset`, as one turn in the DFlash format
  `Problem Statement:\\n{problem_statement}\\nPlease fix the issue described above.` (docs/methods.md §3.4). `lite`
  without `--data-path` is the 150 bundled Lite test rows; `verified` and `full` come from the hub (or
  `--data-path` FILE/DIR);
- `oracle` | `bm25-13k`: the papers' single-turn prompt sets (princeton-nlp/SWE-bench_oracle, SWE-bench_bm25_13K:
  a `text` column), sent as SWE-bench's own `run_api` sends them: the first line as the system message, the rest
  as the user message. Without `--data-path` a small bundled FIXTURE in that schema (tasks/swebench/prompts/,
  not the real prompts); `--data-path hub` or a local file for the real sets.

Turn k of a trajectory is the k-th assistant message; under `--replay logged` (the default) its context is the
logged `messages[0 : that message]`. Observations after the last assistant message are not replayed.

`--data-path` without `--subset` takes trajectories in any format of `_trajectory_formats` (detected, or named
with `--format`): a directory of `.traj.json`/`.traj` files (else of .json/.jsonl/.parquet files), one such file,
a JSON/JSONL/Parquet file of rows (hub trajectory sets, Lite rows, DLite-style `text` rows); `hub` for
princeton-nlp/SWE-bench_Lite test; or an `owner/name` hub id (the trajectory sets read their `train` split).

Every trajectory's `meta` holds `instance_id`, `repo`, `version` and `resolved` (None where unknown), joined from
the bundled Lite instance rows and the bundled run's resolved flags where the data itself lacks them. The runner
copies `repo` into every turn record (`TurnRecord.repo`), so results split by repository.
"""

from __future__ import annotations

from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.tasks._swebench_data import BUNDLED_LITE, INSTANCE_SETS, TASK, PROMPT_SETS, instance_meta, \
    join_instances, load_instances, load_prompt_rows
from evalsuite.tasks._trajectory_formats import LITE_PROMPT, _is_event_list, check_format_name, convert, \
    unique_ids
from evalsuite.tasks._source import HubSpec, hub_rows, local_path, read_json_document, read_records, \
    text_field, wants_hub, HUB as HUB_WORD
from evalsuite.tasks.base import LoadOptions, Trajectory, Turn, register_task, seeded_subset, \
    user_turn

HUB = HubSpec("princeton-nlp/SWE-bench_Lite", split="test")
SUBSETS = TASK.subset_names  # mini-swe-agent, mini-swe-agent-long, swe-agent, lite, verified, full, oracle, bm25-13k
TRAJECTORY_SUBSETS = ("mini-swe-agent", "mini-swe-agent-long", "swe-agent")
BUNDLED = {**{subset: TASK.data_file(subset) for subset in TRAJECTORY_SUBSETS}, "lite": BUNDLED_LITE}
PROMPT_FIXTURE = TASK.data_file("oracle")
# hub trajectory sets and the split that holds their rows
HUB_SPLITS = {"nebius/SWE-agent-trajectories": "train", "nebius/SWE-rebench-openhands-trajectories": "train",
              "SWE-Gym/OpenHands-Sampled-Trajectories": "train.raw"}


def _traj_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith((".traj.json", ".traj")))


def _data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()
                  and p.name.lower().endswith((".json", ".jsonl", ".jsonl.gz", ".parquet")))


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".traj.json", ".traj", ".jsonl.gz", ".jsonl", ".json", ".parquet"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _file_records(path: Path) -> list[tuple[str, str, object]]:
    """(where, fallback name, record): a trajectory file or an event-list JSON is one record; otherwise rows."""
    if path.name.endswith((".traj.json", ".traj")):
        return [(str(path), _stem(path), read_json_document(path))]
    if path.name.lower().endswith(".json"):
        try:
            document = read_json_document(path)
        except UserError:
            document = None  # JSON Lines in a .json file (as BFCL ships): rows below
        if isinstance(document, dict) or _is_event_list(document):
            return [(str(path), _stem(path), document)]
    rows = read_records(path)
    return [(where, str(i), row) for i, (where, row) in enumerate(rows)]  # a row without an id: its index


def _load_path(path: Path, fmt: str | None) -> list[Trajectory]:
    if path.is_dir():
        files = _traj_files(path) or _data_files(path)
        if not files:
            raise UserError(f"--data-path {path}: no .traj.json/.traj trajectory files (or .json/.jsonl/.parquet "
                            "files) in it")
    else:
        files = [path]
    trajectories = []
    for file in files:
        trajectories += [convert(record, where, name, fmt) for where, name, record in _file_records(file)]
    if not trajectories:
        raise UserError(f"--data-path {path}: no records")
    return trajectories


def _instance_trajectory(row: dict, where: str) -> Trajectory:
    instance = row.get("instance_id")
    if not isinstance(instance, str) or not instance:
        raise UserError(f"{where}: instance row has no 'instance_id'")
    prompt = LITE_PROMPT.format(problem_statement=text_field(row, "problem_statement", where))
    return Trajectory(f"swebench-{instance}", [user_turn(prompt)], meta=instance_meta(row, "swebench-instances"))


def _prompt_trajectory(row: dict, where: str, subset: str) -> Trajectory:
    """As SWE-bench's run_api sends a prompt-set row: the first line is the system message, the rest the user's."""
    instance = row.get("instance_id")
    if not isinstance(instance, str) or not instance:
        raise UserError(f"{where}: prompt row has no 'instance_id'")
    text = text_field(row, "text", where)
    system, _, user = text.partition("\n")
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}] if user.strip() \
        else [{"role": "user", "content": text}]
    meta = instance_meta(row, f"swebench-{subset}")
    return Trajectory(f"swebench-{instance}", [Turn(new_messages=messages)], meta=meta)


def _instances(subset: str, data_path: str | None) -> list[Trajectory]:
    if data_path is None and subset == "lite":
        rows, label = load_instances(BUNDLED_LITE), str(BUNDLED_LITE)
    elif data_path is None or data_path == HUB_WORD:
        rows, label = load_instances(INSTANCE_SETS[subset], hub_label=INSTANCE_SETS[subset]), INSTANCE_SETS[subset]
    elif wants_hub(data_path):
        rows, label = load_instances(data_path, hub_label=data_path), data_path
    else:
        path = local_path(data_path)
        rows, label = load_instances(path, subset=subset), str(path)
    return [_instance_trajectory(row, f"{label}[{i}]") for i, row in enumerate(rows)]


def _prompts(subset: str, data_path: str | None) -> list[Trajectory]:
    if data_path is None:
        rows = load_prompt_rows(PROMPT_FIXTURE)
    elif data_path == HUB_WORD or wants_hub(data_path):
        rows = load_prompt_rows("", hub_label=PROMPT_SETS[subset] if data_path == HUB_WORD else data_path)
    else:
        rows = load_prompt_rows(local_path(data_path))
    return [_prompt_trajectory(row, where, subset) for where, row in rows]


def _trajectories(options: LoadOptions) -> list[Trajectory]:
    fmt, data_path = options.format, options.data_path
    if data_path and options.subset is not None:
        raise UserError(f"--subset {options.subset}: swebench's trajectory subsets pick bundled data; with "
                        f"--data-path drop --subset (and name the format with --format if it is not detected)")
    if data_path == HUB_WORD:  # the reference copy: SWE-bench Lite test, one turn per instance
        if fmt not in (None, "auto", "swebench-instances"):
            raise UserError(f"--format {fmt}: --data-path hub is SWE-bench Lite's instance rows; pass the hub id of a "
                            "trajectory set instead (e.g. --data-path nebius/SWE-agent-trajectories)")
        return [convert(row, where, str(i), "swebench-instances")
                for i, (where, row) in enumerate(hub_rows("swebench", HUB))]
    if wants_hub(data_path):
        spec = HubSpec(data_path, split=HUB_SPLITS.get(data_path, HUB.split))
        return [convert(row, where, str(i), fmt) for i, (where, row) in enumerate(hub_rows("swebench", spec))]
    if data_path:
        return _load_path(local_path(data_path), fmt)
    return _load_path(BUNDLED[options.subset or TASK.default_subset], fmt)


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    check_format_name(options.format)
    subset = options.subset
    if subset is not None and subset not in SUBSETS:
        raise UserError(f"--subset {subset}: swebench has subsets {', '.join(SUBSETS)}")
    if subset not in (None, *TRAJECTORY_SUBSETS) and options.format not in (None, "auto"):
        raise UserError(f"--format {options.format}: --subset {subset} reads instance or prompt rows, not "
                        "trajectories; drop --format")
    if subset in INSTANCE_SETS:
        trajectories = _instances(subset, options.data_path)
    elif subset in PROMPT_SETS:
        trajectories = _prompts(subset, options.data_path)
    else:
        trajectories = join_instances(_trajectories(options))
    if not trajectories:
        raise UserError("swebench: no records")
    return seeded_subset(unique_ids(trajectories), options.limit, options.seed)
