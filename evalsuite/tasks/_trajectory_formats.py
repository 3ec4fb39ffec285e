"""Agent-trajectory formats → trajectories of turns (one turn per assistant message, logged replay).

Each format is a small adapter from one documented record shape to OpenAI-style messages, which
`_conversation.conversation_trajectory` then checks and cuts into turns. A record is one row of a JSON / JSON
Lines / Parquet file, or one whole trajectory file (`.traj`, `.traj.json`, an OpenHands event list).

| name | where it comes from | record shape |
|---|---|---|
| `mini-swe-agent` | mini-swe-agent `.traj.json` | `{messages: [{role, content}], info?, instance_id?}` |
| `swe-agent` | SWE-agent `.traj` | `{history: [{role, content, tool_calls?, ...}], info}` |
| `openhands` | OpenHands event log (a saved trajectory, or an evaluation `output.jsonl` row) | `[{id, source, action, args, tool_call_metadata?} | {id, source, observation, content, cause, tool_call_metadata?}]`, or `{instance_id, history: [events], test_result?}` |
| `nebius-swe-agent` | HF nebius/SWE-agent-trajectories | `{instance_id, model_name, target, trajectory: [{role: system|user|ai, text, system_prompt, mask}], exit_status, generated_patch}` |
| `swe-gym-openhands` | HF SWE-Gym/OpenHands-Sampled-Trajectories | `{instance_id, run_id, resolved, messages: [OpenAI messages], tools, test_result}` |
| `swe-rebench-openhands` | HF nebius/SWE-rebench-openhands-trajectories | `{trajectory_id, instance_id, repo, trajectory: [OpenAI messages], tools, model_patch, exit_status, resolved}` |
| `swebench-instances` | SWE-bench instance rows | `{instance_id, problem_statement, repo, version, ...}`: one turn, the DFlash prompt |
| `swebench-prompts` | DLite-style prompt rows | `{text, instance_id?}`: the whole text as one user turn |

`detect_format` picks the format from the record's keys; `--format NAME` names it instead. A record that fits
none is a one-line error naming the formats.

Every trajectory's `meta` carries what a report needs to split results by repository: `instance_id`, `repo`
(`owner/name`, from the record or derived from a SWE-bench instance id `owner__name-123`), `resolved` (True/False,
or None when the data has no flag), `format`, and, where the data has them, `version`, `exit_status`, `model`
and the record's own trajectory id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from evalsuite.errors import UserError
from evalsuite.tasks._conversation import conversation_trajectory
from evalsuite.tasks._source import text_field
from evalsuite.tasks.base import Trajectory, user_turn

LITE_PROMPT = "Problem Statement:\n{problem_statement}\nPlease fix the issue described above."
_INSTANCE_ID = re.compile(r"(?P<owner>[^_/\s]+(?:_[^_/\s]+)*)__(?P<name>.+)-(?P<number>\d+)")


def repo_from_instance_id(instance_id: str | None) -> str | None:
    """`django__django-11099` → `django/django`; None when the id is not a SWE-bench-style id."""
    if not isinstance(instance_id, str):
        return None
    found = _INSTANCE_ID.fullmatch(instance_id)
    return f"{found['owner']}/{found['name']}" if found else None


def as_bool(value) -> bool | None:
    """A resolved flag as the data stores it (bool, 0/1, "true"), or None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    return None


def drop_nulls(value):
    """Parquet stores a list of structs with the union of every row's keys, missing ones as null: drop them."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def _maybe_json(value):
    """Hub sets store some nested fields (tool arguments, schemas) as JSON strings."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _tools(value, where: str) -> list[dict] | None:
    value = _maybe_json(value)
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise UserError(f"{where}: 'tools' must be a list of function schemas")
    tools = []
    for tool in value:
        tool = drop_nulls(_maybe_json(tool))
        if not isinstance(tool, dict):
            raise UserError(f"{where}: a tool schema must be an object")
        function = tool.get("function")
        if isinstance(function, dict) and "parameters" in function:
            function["parameters"] = _maybe_json(function["parameters"])
        tools.append(tool)
    return tools


def _meta(fmt: str, instance_id, *, repo=None, resolved=None, **extra) -> dict:
    meta = {"format": fmt, "instance_id": instance_id, "repo": repo or repo_from_instance_id(instance_id),
            "resolved": as_bool(resolved)}
    meta.update({k: v for k, v in extra.items() if v is not None})
    return meta


def _sample_id(instance_id, fallback: str) -> str:
    return f"swebench-{instance_id or fallback}"


# ---- the formats ----------------------------------------------------------------------------------------------
def _mini_swe_agent(record: dict, where: str, name: str) -> Trajectory:
    info = record.get("info") or {}
    instance = record.get("instance_id") or name
    model = ((info.get("config") or {}).get("model") or {}).get("model_name")  # who wrote the logged replies
    return conversation_trajectory(_sample_id(instance, name), record["messages"], where, trailing_turn=False,
                                   meta=_meta("mini-swe-agent", instance, exit_status=info.get("exit_status"),
                                              model=model))


def _swe_agent(record: dict, where: str, name: str) -> Trajectory:
    info = record.get("info") or {}
    instance = record.get("instance_id") or name
    return conversation_trajectory(_sample_id(instance, name), record["history"], where, trailing_turn=False,
                                   meta=_meta("swe-agent", instance, exit_status=info.get("exit_status")))


def _nebius_swe_agent(record: dict, where: str, name: str) -> Trajectory:
    roles = {"system": "system", "user": "user", "ai": "assistant", "assistant": "assistant"}
    messages = []
    for i, step in enumerate(record["trajectory"]):
        if not isinstance(step, dict) or step.get("role") not in roles:
            raise UserError(f"{where} step {i}: role must be one of system, user, ai")
        text = step.get("system_prompt") if step["role"] == "system" and not step.get("text") else step.get("text")
        messages.append({"role": roles[step["role"]], "content": text})
    instance = record.get("instance_id")
    return conversation_trajectory(_sample_id(instance, name), messages, where, trailing_turn=False,
                                   meta=_meta("nebius-swe-agent", instance, resolved=record.get("target"),
                                              exit_status=record.get("exit_status"),
                                              model=record.get("model_name")))


def _openai_messages(messages, where: str) -> list[dict]:
    if not isinstance(messages, list):
        raise UserError(f"{where}: the messages must be a list")
    return [drop_nulls(m) if isinstance(m, dict) else m for m in messages]


def _swe_gym_openhands(record: dict, where: str, name: str) -> Trajectory:
    instance = record.get("instance_id")
    return conversation_trajectory(_sample_id(instance, name), _openai_messages(record["messages"], where), where,
                                   trailing_turn=False, tools=_tools(record.get("tools"), where),
                                   meta=_meta("swe-gym-openhands", instance, resolved=record.get("resolved"),
                                              run_id=record.get("run_id")))


def _swe_rebench_openhands(record: dict, where: str, name: str) -> Trajectory:
    instance = record.get("instance_id")
    return conversation_trajectory(_sample_id(instance, name), _openai_messages(record["trajectory"], where), where,
                                   trailing_turn=False, tools=_tools(record.get("tools"), where),
                                   meta=_meta("swe-rebench-openhands", instance, repo=record.get("repo"),
                                              resolved=record.get("resolved"), exit_status=record.get("exit_status"),
                                              trajectory_id=record.get("trajectory_id")))


# OpenHands events that never reach the model's context (state changes, memory recalls, no-ops)
_OPENHANDS_SKIPPED = {"change_agent_state", "agent_state_changed", "null", "recall", "condensation",
                      "condensation_request", "pause", "resume"}


def _openhands_events(record) -> list:
    return record["history"] if isinstance(record, dict) else record


def _openhands(record, where: str, name: str) -> Trajectory:
    """OpenHands events → messages, as OpenHands' own ConversationMemory builds them in function-calling mode:
    the system action is the system message (its `args.tools` the tools); user/agent `message` actions are user/
    assistant messages; an agent action that came from a tool call contributes its LLM response once (the
    `tool_call_metadata.model_response` message, with its tool calls), and the observation answering it becomes a
    `tool` message with that call's id. Agent actions without tool-call metadata (non-function-calling agents) keep
    their `message` text as the assistant message and their observations become user messages. State changes and
    recalls are dropped."""
    events = _openhands_events(record)
    messages: list[dict] = []
    tools = None
    seen_responses: set[str] = set()
    for i, event in enumerate(events):
        here = f"{where} event {i}"
        if not isinstance(event, dict):
            raise UserError(f"{here}: an OpenHands event must be an object")
        source = event.get("source")
        metadata = event.get("tool_call_metadata") or None
        if "action" in event:
            action, args = event.get("action"), event.get("args") or {}
            if action in _OPENHANDS_SKIPPED:
                continue
            if action == "system":
                messages.append({"role": "system", "content": args.get("content") or event.get("message") or ""})
                tools = _tools(args.get("tools"), here)
            elif metadata is not None:
                response = metadata.get("model_response") or {}
                key = str(response.get("id") or f"event-{i}")
                if key in seen_responses:
                    continue
                seen_responses.add(key)
                choices = response.get("choices") or []
                message = (choices[0] or {}).get("message") if choices else None
                if not isinstance(message, dict):
                    raise UserError(f"{here}: tool_call_metadata.model_response has no choices[0].message")
                messages.append({"role": "assistant", "content": message.get("content"),
                                 "tool_calls": message.get("tool_calls") or []})
            elif action == "message":
                messages.append({"role": "user" if source == "user" else "assistant",
                                 "content": args.get("content") if args.get("content") is not None
                                 else event.get("message")})
            elif source == "agent":
                messages.append({"role": "assistant", "content": args.get("thought") or event.get("message")})
        elif "observation" in event:
            if event.get("observation") in _OPENHANDS_SKIPPED:
                continue
            content = event.get("content")
            if metadata is not None:
                messages.append({"role": "tool", "tool_call_id": metadata.get("tool_call_id"),
                                 "name": metadata.get("function_name"), "content": content or ""})
            elif content:
                messages.append({"role": "user", "content": content})
        else:
            raise UserError(f"{here}: neither an action nor an observation")
    messages = [m for m in messages if m.get("content") or m.get("tool_calls") or m["role"] == "tool"]
    instance = record.get("instance_id") if isinstance(record, dict) else None
    report = (record.get("report") or {}) if isinstance(record, dict) else {}
    resolved = report.get("resolved") if isinstance(report, dict) else None
    return conversation_trajectory(_sample_id(instance, name), messages, where, trailing_turn=False, tools=tools,
                                   meta=_meta("openhands", instance or name, resolved=resolved))


def _swebench_instance(record: dict, where: str, name: str) -> Trajectory:
    instance = record.get("instance_id") or name
    prompt = LITE_PROMPT.format(problem_statement=text_field(record, "problem_statement", where))
    return Trajectory(_sample_id(instance, name), [user_turn(prompt)],
                      meta=_meta("swebench-instances", record.get("instance_id"), repo=record.get("repo"),
                                 version=record.get("version")))


def _swebench_prompt(record: dict, where: str, name: str) -> Trajectory:
    instance = record.get("instance_id") or name
    return Trajectory(_sample_id(instance, name), [user_turn(text_field(record, "text", where))],
                      meta=_meta("swebench-prompts", record.get("instance_id"), repo=record.get("repo"),
                                 version=record.get("version")))


# ---- detection ------------------------------------------------------------------------------------------------
def _is_event_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(e, dict) and ("action" in e or "observation" in e) for e in value[:5])


def _steps(record, key: str) -> list:
    value = record.get(key) if isinstance(record, dict) else None
    return value if isinstance(value, list) else []


def _first_roles(steps: list) -> set:
    return {s.get("role") for s in steps[:8] if isinstance(s, dict)}


def _is_openhands(record) -> bool:
    return _is_event_list(record) or (isinstance(record, dict) and _is_event_list(record.get("history")))


def _is_swe_agent(record) -> bool:
    steps = _steps(record, "history")
    return bool(steps) and not _is_event_list(steps) and all(isinstance(s, dict) and "role" in s for s in steps[:5])


def _is_nebius(record) -> bool:
    steps = _steps(record, "trajectory")
    return bool(steps) and ("ai" in _first_roles(steps) or all(isinstance(s, dict) and "text" in s
                                                                  for s in steps[:5]))


def _is_rebench(record) -> bool:
    steps = _steps(record, "trajectory")
    return bool(steps) and not _is_nebius(record) and all(isinstance(s, dict) and "role" in s for s in steps[:5])


def _is_swe_gym(record) -> bool:
    return bool(_steps(record, "messages")) and any(k in record for k in ("run_id", "test_result", "tools"))


def _is_mini(record) -> bool:
    return bool(_steps(record, "messages")) and not _is_swe_gym(record)


def _has(key: str) -> Callable[[Any], bool]:
    return lambda record: isinstance(record, dict) and isinstance(record.get(key), str)


@dataclass(frozen=True)
class TrajectoryFormat:
    name: str
    detect: Callable[[Any], bool]
    convert: Callable[[Any, str, str], Trajectory]
    summary: str


# detection order matters: the first format whose shape fits wins
FORMATS: dict[str, TrajectoryFormat] = {f.name: f for f in (
    TrajectoryFormat("openhands", _is_openhands, _openhands, "OpenHands event log (list of actions/observations)"),
    TrajectoryFormat("swe-agent", _is_swe_agent, _swe_agent, "SWE-agent .traj ({history, info})"),
    TrajectoryFormat("nebius-swe-agent", _is_nebius, _nebius_swe_agent,
                     "nebius/SWE-agent-trajectories rows ({trajectory: [{role: system|user|ai, text}]})"),
    TrajectoryFormat("swe-rebench-openhands", _is_rebench, _swe_rebench_openhands,
                     "nebius/SWE-rebench-openhands-trajectories rows ({trajectory: [OpenAI messages], tools})"),
    TrajectoryFormat("swe-gym-openhands", _is_swe_gym, _swe_gym_openhands,
                     "SWE-Gym/OpenHands-Sampled-Trajectories rows ({messages, tools, run_id, resolved})"),
    TrajectoryFormat("mini-swe-agent", _is_mini, _mini_swe_agent, "mini-swe-agent .traj.json ({messages, info})"),
    TrajectoryFormat("swebench-instances", _has("problem_statement"), _swebench_instance,
                     "SWE-bench instance rows ({instance_id, problem_statement, ...}), one turn"),
    TrajectoryFormat("swebench-prompts", _has("text"), _swebench_prompt, "prompt rows ({text}), one turn"),
)}
FORMAT_NAMES = tuple(FORMATS)


def check_format_name(name: str | None) -> None:
    if name is not None and name != "auto" and name not in FORMATS:
        raise UserError(f"--format {name}: choose from auto, {', '.join(FORMAT_NAMES)}")


def detect_format(record, where: str) -> TrajectoryFormat:
    for fmt in FORMATS.values():
        if fmt.detect(record):
            return fmt
    keys = ", ".join(sorted(record)[:8]) if isinstance(record, dict) else f"a {type(record).__name__}"
    raise UserError(f"{where}: not a known trajectory format (found {keys}); the formats are "
                    f"{', '.join(FORMAT_NAMES)} (name one with --format)")


def convert(record, where: str, name: str, fmt: str | None = None) -> Trajectory:
    """One record → a trajectory; `fmt` None/"auto" detects the format. `name` stands in for a missing
    instance id (the file name, or the row's position)."""
    check_format_name(fmt)
    chosen = detect_format(record, where) if fmt in (None, "auto") else FORMATS[fmt]
    if fmt not in (None, "auto") and not chosen.detect(record):
        raise UserError(f"{where}: this record is not in the {fmt} format ({chosen.summary})")
    return chosen.convert(record, where, name)


def unique_ids(trajectories: list[Trajectory]) -> list[Trajectory]:
    """Hub sets hold several trajectories per instance: the second and later get `#2`, `#3`… in file order."""
    seen: dict[str, int] = {}
    for trajectory in trajectories:
        count = seen.get(trajectory.sample_id, 0) + 1
        seen[trajectory.sample_id] = count
        if count > 1:
            trajectory.sample_id = f"{trajectory.sample_id}#{count}"
    return trajectories
