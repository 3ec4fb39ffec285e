"""Logged conversations (OpenAI-style message lists) → trajectories of turns.

Turn k is the k-th assistant message: its new messages are everything since the previous assistant message
(user prompts, tool observations), and the assistant message itself is the logged reply. So under
`--replay logged` turn k's context is exactly `messages[0 : index of the k-th assistant message]`, rendered.
Messages after the last assistant message become one more turn without a logged reply (the model speaks
there) when `trailing_turn` is set; agent logs that end on an observation drop them.

Every message is checked and reduced to the keys chat templates read (role, content, tool_calls,
tool_call_id, name); a malformed one is a one-line `UserError` naming the record and the message index.
"""

from __future__ import annotations

import json

from evalsuite.errors import UserError
from evalsuite.tasks.base import Trajectory, Turn

ROLES = ("system", "user", "assistant", "tool")


def message_text(content, where: str) -> str:
    """Message content as text; OpenAI content-part lists keep their text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                texts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                texts.append(part)
            else:
                raise UserError(f"{where}: content part {part!r:.60} is not text; only text content can be replayed")
        return "".join(texts)
    raise UserError(f"{where}: content must be a string or a list of text parts, got {type(content).__name__}")


def tool_call(call, where: str) -> dict:
    """One OpenAI tool call, normalized: arguments as a dict (a JSON object string is parsed). Arguments that are
    not a JSON object are refused: chat templates render them as an object, so a replay could not be faithful."""
    if not isinstance(call, dict):
        raise UserError(f"{where}: a tool call must be an object")
    function = call.get("function", call)
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}: a tool call has no function name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise UserError(f"{where} ({name}): arguments are not valid JSON ({err.msg} at character {err.pos}); "
                            "fix the record") from None
    if not isinstance(arguments, dict):
        raise UserError(f"{where} ({name}): arguments must be a JSON object, got {type(arguments).__name__}")
    out = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call.get("id"):
        out["id"] = str(call["id"])
    return out


def normalize_message(message, where: str) -> dict:
    if not isinstance(message, dict):
        raise UserError(f"{where}: a message must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in ROLES:
        raise UserError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    if "content" not in message and not message.get("tool_calls"):
        raise UserError(f"{where}: message has no 'content'")
    out = {"role": role, "content": message_text(message.get("content"), where)}
    calls = message.get("tool_calls") or []
    if calls:
        if role != "assistant":
            raise UserError(f"{where}: only assistant messages may carry tool_calls")
        if not isinstance(calls, list):
            raise UserError(f"{where}: tool_calls must be a list")
        out["tool_calls"] = [tool_call(c, f"{where} tool call {i}") for i, c in enumerate(calls)]
    if role == "tool":
        call_id = message.get("tool_call_id") or (message.get("tool_call_ids") or [None])[0]
        if call_id:
            out["tool_call_id"] = str(call_id)
        if message.get("name"):
            out["name"] = str(message["name"])
    elif not out["content"].strip() and not calls:
        raise UserError(f"{where}: {role} message has empty content")
    return out


def check_order(messages: list[dict], where: str) -> None:
    """System messages only lead; a user message comes before the first assistant; tool results follow a tool call."""
    seen_other = False
    seen_user = False
    previous = None
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system" and seen_other:
            raise UserError(f"{where} message {i}: wrong role order: system message after the conversation started")
        if role != "system":
            seen_other = True
        if role == "user":
            seen_user = True
        if role == "assistant" and not seen_user:
            raise UserError(f"{where} message {i}: wrong role order: assistant message before any user message")
        if role == "tool" and not (previous is not None and (previous["role"] == "tool"
                                                              or previous.get("tool_calls"))):
            raise UserError(f"{where} message {i}: wrong role order: tool result without a preceding tool call")
        previous = m


def conversation_trajectory(sample_id: str, messages, where: str, *, trailing_turn: bool,
                            tools: list[dict] | None = None, meta: dict | None = None) -> Trajectory:
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: 'messages' must be a non-empty list")
    clean = [normalize_message(m, f"{where} message {i}") for i, m in enumerate(messages)]
    check_order(clean, where)
    turns: list[Turn] = []
    pending: list[dict] = []
    for message in clean:
        if message["role"] == "assistant":
            turns.append(Turn(new_messages=pending, logged_reply=message))
            pending = []
        else:
            pending.append(message)
    if pending and trailing_turn:
        if not any(m["role"] in ("user", "tool") for m in pending):
            raise UserError(f"{where}: the last turn has no user or tool message for the model to answer")
        turns.append(Turn(new_messages=pending))
    if not turns:
        raise UserError(f"{where}: no assistant message to replay")
    return Trajectory(sample_id, turns, tools=tools, meta=dict(meta or {}))
