"""The replay module on its own: message-level truncate-left with golden rendered prompts (the tiny byte-level
ChatML tokenizer of evalsuite.testing, one token per byte plus one per special token), the stop policy, raw ids,
and how each method's history and `replay` label evolve."""

from __future__ import annotations

import pytest

from evalsuite.errors import UserError
from evalsuite.replay import (FreeReplay, LoggedReplay, MethodReplay, Window, check_replay_mode, make_policy,
                              replay_type, split_for_truncation)
from evalsuite.target.chat import fit_to_template
from evalsuite.tasks.base import Trajectory, Turn
from evalsuite.testing import byte_tokenizer

TOKENIZER = byte_tokenizer()
CALL = {"function": {"name": "sh", "arguments": {"cmd": "ls"}}}


def render(messages: list[dict]) -> list[int]:
    """What Runner._render does for a template without tool support."""
    messages, _ = fit_to_template(messages, None, TOKENIZER.chat_template)
    text = TOKENIZER.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def text(ids: list[int]) -> str:
    return TOKENIZER.decode(ids)


CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "TASK"},
    {"role": "assistant", "content": "A1", "tool_calls": [CALL]},
    {"role": "tool", "content": "R1"},
    {"role": "assistant", "content": "A2"},
    {"role": "user", "content": "U2"},
    {"role": "assistant", "content": "A3"},
    {"role": "user", "content": "U3"},  # the turn's newest message
]
HEAD = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nTASK<|im_end|>\n"
TAIL = "<|im_start|>user\nU3<|im_end|>\n<|im_start|>assistant\n"


def truncate(budget: int, messages=CONVERSATION, newest: int = 1):
    window = Window(max_context=budget + 8 + 4 + 1, max_new_tokens=8, k=4)
    assert window.budget == budget
    return make_policy("truncate-left", window).fit_messages(messages, newest, render)


def test_a_context_that_fits_is_left_alone():
    full = render(CONVERSATION)
    assert truncate(len(full)) == (full, 0, 0, "")


def test_the_fewest_whole_oldest_messages_go_golden():
    full = render(CONVERSATION)
    # exactly room for system + task + the latest reply A3 + U3: the tool call with its result, A2 and U2 go
    budget = len(render(CONVERSATION[:2] + CONVERSATION[6:]))
    ids, dropped_messages, dropped_tokens, skip = truncate(budget)
    assert skip == ""
    assert text(ids) == HEAD + "<|im_start|>assistant\nA3<|im_end|>\n" + TAIL
    assert dropped_messages == 4 and dropped_tokens == len(full) - len(ids) == len(full) - budget
    # one token short of keeping the step A2, U2: it goes too, as a whole
    ids, dropped_messages, _, _ = truncate(len(render(CONVERSATION[:2] + CONVERSATION[4:])) - 1)
    assert text(ids) == HEAD + "<|im_start|>assistant\nA3<|im_end|>\n" + TAIL and dropped_messages == 4


def test_a_tool_call_and_its_result_go_together_golden():
    full = render(CONVERSATION)
    ids, dropped_messages, dropped_tokens, skip = truncate(len(full) - 1)
    assert skip == "" and dropped_messages == 2  # the call with its result: one agent step
    assert text(ids) == (HEAD + "<|im_start|>assistant\nA2<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n"
                         "<|im_start|>assistant\nA3<|im_end|>\n" + TAIL)
    assert dropped_tokens == len(full) - len(ids)


def test_every_budget_gives_whole_messages_that_fit():
    """Never a cut inside a message or a template header: the prompt is always the rendering of a sub-list."""
    blocks = {"<|im_start|>" + b for b in text(render(CONVERSATION)).split("<|im_start|>") if b}
    smallest = len(render(CONVERSATION[:2] + CONVERSATION[-2:]))
    for budget in range(smallest, len(render(CONVERSATION)) + 1):
        ids, dropped_messages, dropped_tokens, skip = truncate(budget)
        assert skip == "" and len(ids) <= budget
        rendered = text(ids)
        assert rendered.startswith(HEAD) and rendered.endswith("<|im_start|>assistant\nA3<|im_end|>\n" + TAIL)
        assert all("<|im_start|>" + b in blocks for b in rendered.split("<|im_start|>") if b)
        assert "<tool_response>" not in rendered or "<tool_call>" in rendered


def test_the_kept_messages_alone_not_fitting_is_a_skip():
    smallest = len(render(CONVERSATION[:2] + CONVERSATION[-2:]))  # system, task, the latest reply, U3
    ids, dropped_messages, dropped_tokens, skip = truncate(smallest - 1)
    assert ids == render(CONVERSATION) and dropped_messages == dropped_tokens == 0
    assert f"the 4 messages truncate-left keeps (system and task, the latest reply and this turn's new messages) " \
           f"take {smallest} tokens, more than the {smallest - 1}" in skip
    assert "--context-policy truncate-left" in skip and "\n" not in skip


def test_tool_results_of_the_newest_turn_keep_their_call():
    messages = CONVERSATION[:6] + [{"role": "assistant", "content": "A3", "tool_calls": [CALL]},
                                   {"role": "tool", "content": "R3"}]
    head, units, tail = split_for_truncation(messages, 1)
    assert head == messages[:2] and tail == messages[6:]
    assert units == [messages[2:4], messages[4:6]]  # agent steps: an assistant message and what answers it
    ids, dropped_messages, _, skip = truncate(len(render(messages[:2] + messages[6:])), messages)
    assert skip == "" and dropped_messages == 4
    assert "A3\n<tool_call>" in text(ids) and "R3" in text(ids)


def test_stop_policy_skips_at_the_window_and_never_drops():
    full = render(CONVERSATION)
    stop = make_policy("stop", Window(max_context=len(full) + 1, max_new_tokens=8, k=4))
    ids, dropped_messages, dropped_tokens, skip = stop.fit_messages(CONVERSATION, 1, render)
    assert ids == full and dropped_messages == dropped_tokens == 0
    assert skip == f"context of {len(full)} tokens reaches the target maximum of {len(full) + 1} (--context-policy stop)"
    fits = make_policy("stop", Window(max_context=len(full) + 2, max_new_tokens=8, k=4))
    assert fits.fit_messages(CONVERSATION, 1, render) == (full, 0, 0, "")


def test_raw_ids_keep_the_token_level_cut():
    window = Window(max_context=32, max_new_tokens=8, k=4)  # room for 32 - 8 - 4 - 1 = 19 tokens
    ids = list(range(40))
    assert make_policy("truncate-left", window).fit_ids(ids) == (ids[-19:], 21, "")
    assert make_policy("truncate-left", window).fit_ids(ids[:19]) == (ids[:19], 0, "")
    assert make_policy("stop", window).fit_ids(ids)[2].startswith("context of 40 tokens reaches")


def conversation(with_middle_reply: bool = True) -> Trajectory:
    return Trajectory("t", [
        Turn([{"role": "user", "content": "one"}], {"role": "assistant", "content": "logged one"}),
        Turn([{"role": "user", "content": "two"}],
             {"role": "assistant", "content": "logged two"} if with_middle_reply else None),
        Turn([{"role": "user", "content": "three"}], {"role": "assistant", "content": "logged three"}),
        Turn([{"role": "user", "content": "four"}]),
    ])


def roomy():
    return make_policy("stop", Window(max_context=4096, max_new_tokens=8, k=4))


def replay_all(replay: MethodReplay, skip: set[int] = frozenset()):
    contexts = []
    for i in range(len(replay.trajectory.turns)):
        context = replay.context(i)
        contexts.append(context)
        replay.record_reply(i, None if (i in skip or context.skipped) else f"model {i}")
    return contexts


def test_logged_replay_without_a_logged_reply_says_where_the_history_came_from():
    contexts = replay_all(LoggedReplay(conversation(with_middle_reply=False), roomy(), render))
    assert [c.label for c in contexts] == ["logged", "logged", "mixed", "mixed"]
    assert "model 1" in text(contexts[2].ids) and "logged one" in text(contexts[2].ids)
    only_model = Trajectory("t", [Turn([{"role": "user", "content": "a"}]), Turn([{"role": "user", "content": "b"}])])
    assert [c.label for c in replay_all(LoggedReplay(only_model, roomy(), render))] == ["logged", "free"]
    free = replay_all(FreeReplay(conversation(), roomy(), render))
    assert [c.label for c in free] == ["free"] * 4 and "logged" not in text(free[3].ids)


def test_a_skipped_turn_without_a_reply_to_stand_in_ends_the_history_with_a_reason():
    logged = replay_all(LoggedReplay(conversation(), roomy(), render), skip={1})
    assert [c.skipped for c in logged] == [False, False, False, False]  # the logged reply stands in
    assert "logged two" in text(logged[2].ids)
    free = replay_all(FreeReplay(conversation(), roomy(), render), skip={1})
    assert [c.skipped for c in free] == [False, False, True, True]
    assert free[2].skip_reason == ("turn 1 was skipped and produced no reply (free replay), so this turn has no "
                                   "history to continue from")
    gap = replay_all(LoggedReplay(conversation(with_middle_reply=False), roomy(), render), skip={1})
    assert gap[3].skip_reason.startswith("turn 1 was skipped and has no logged reply")


@pytest.mark.parametrize("mode", ["logged", "free"])
def test_raw_turns_ignore_the_history(mode):
    trajectory = Trajectory("r", [Turn([], prompt_ids=[5, 6, 7]), Turn([], prompt_ids=[5, 6, 7, 8])])
    contexts = replay_all(replay_type(mode)(trajectory, roomy(), render))
    assert [(c.label, c.ids) for c in contexts] == [("raw", [5, 6, 7]), ("raw", [5, 6, 7, 8])]


def test_explicit_logged_replay_on_data_without_logged_replies_is_refused():
    two_turns = Trajectory("m", [Turn([{"role": "user", "content": "a"}]), Turn([{"role": "user", "content": "b"}])])
    with pytest.raises(UserError, match="--replay logged: task mt-bench has no logged assistant replies to replay; "
                                        "use --replay free"):
        check_replay_mode("logged", [two_turns], "mt-bench")
    check_replay_mode("free", [two_turns], "mt-bench")
    check_replay_mode("logged", [conversation()], "custom")
    check_replay_mode("logged", [Trajectory("g", [Turn([{"role": "user", "content": "q"}])])], "gsm8k")  # one turn
