"""Fit OpenAI-style messages (tool schemas, tool calls, tool results) to the target's chat template.

A template with its own tool support (Qwen3, Llama 3.1, …) receives them unchanged and renders them its way.
A template without it (SmolLM2's plain ChatML ignores `tools` and cannot print `tool_calls`) gets a text
fallback in the Hermes/Qwen convention those models' own templates use, so nothing is silently dropped:
- tool schemas → a block appended to the system message (a system message is inserted when there is none);
- assistant tool calls → `<tool_call>{"name": …, "arguments": …}</tool_call>` lines after the content;
- tool results → user messages wrapped in `<tool_response>…</tool_response>`.
Feature detection reads the template source: `tools` (schemas), `tool_calls` (calls) and a `'tool'` role test.
"""

from __future__ import annotations

import json
import re

_TOOL_ROLE = re.compile(r"""['"]tool['"]""")

TOOLS_HEADER = ("You can call the following functions. Their JSON schemas, one per line:\n<tools>\n{schemas}\n</tools>\n"
                "To call a function, reply with one line per call: "
                "<tool_call>{{\"name\": <function name>, \"arguments\": <JSON object>}}</tool_call>")


def template_features(template: str) -> dict[str, bool]:
    return {"tools": "tools" in template, "tool_calls": "tool_calls" in template,
            "tool_role": bool(_TOOL_ROLE.search(template))}


def render_tool_call(call: dict) -> str:
    function = call.get("function", call)
    return "<tool_call>" + json.dumps({"name": function["name"], "arguments": function.get("arguments", {})},
                                      ensure_ascii=False) + "</tool_call>"


def fit_to_template(messages: list[dict], tools: list[dict] | None,
                    template: str) -> tuple[list[dict], list[dict] | None]:
    """Returns (messages, tools) ready for `apply_chat_template`; the inputs are not modified."""
    features = template_features(template)
    out: list[dict] = []
    for message in messages:
        message = dict(message)
        if message.get("content") is None:
            message["content"] = ""
        calls = message.get("tool_calls")
        if calls and not features["tool_calls"]:
            lines = [message["content"]] if message["content"] else []
            lines += [render_tool_call(c) for c in calls]
            message = {"role": message["role"], "content": "\n".join(lines)}
        elif message["role"] == "tool" and not features["tool_role"]:
            message = {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
        out.append(message)
    if tools and not features["tools"]:
        block = TOOLS_HEADER.format(schemas="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
        tools = None
    return out, tools
