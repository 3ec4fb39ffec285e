"""The target's side of the conversation without its weights: `ChatTokenizer` (tokenizer, chat template, window and
stop tokens; what the runner renders contexts with, for every engine), and `fit_to_template`.

`fit_to_template` fits OpenAI-style messages (tool schemas, tool calls, tool results) to the target's chat template.

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
from dataclasses import dataclass

from evalsuite.errors import UserError
from evalsuite.hashing import text_hash

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


@dataclass
class ChatTokenizer:
    """What rendering and replay need from a target: its tokenizer and chat template, its window and stop ids."""

    tokenizer: object  # a transformers tokenizer
    name: str
    model_dir: str
    max_context: int
    vocab_size: int
    stop_ids: frozenset[int]

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def render(self, messages: list[dict], tools: list[dict] | None = None, enable_thinking: bool = False
               ) -> list[int]:
        """A conversation up to the assistant's turn, through the tokenizer's own template; tools and tool messages
        fall back to text where the template has no support for them."""
        from jinja2 import TemplateError

        if not self.chat_template:
            raise UserError(f"target {self.name} has no chat template; use prompt_ids records (--task custom)")
        messages, tools = fit_to_template(messages, tools, self.chat_template)
        kwargs = {"add_generation_prompt": True, "enable_thinking": enable_thinking}
        if tools:
            kwargs["tools"] = tools
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        except TemplateError as err:
            raise UserError(f"target {self.name}: its chat template cannot render this conversation ({err}); try "
                            "--task custom with prompt_ids") from err
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def hashes(self) -> dict:
        """What run.json records about the tokenizer and template (drift fields)."""
        return {"chat_template_sha256": text_hash(self.chat_template),
                "tokenizer_sha256": text_hash(json.dumps(self.tokenizer.get_vocab(), sort_keys=True))}
