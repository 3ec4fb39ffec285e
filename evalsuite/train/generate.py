"""Self-distillation data: the target answers every training prompt greedily (T=0).

Why regenerate instead of one teacher-forced pass over the logged ShareGPT replies: at T=0 a drafter is
accepted exactly when it predicts the target's own greedy continuation *on text the target wrote itself*.
Logged GPT replies are another model's text, so their contexts (and the target features on them) differ from
what the drafter sees at evaluation. DLite, DSpark and EAGLE-3 all train on target-regenerated data for the same
reason (docs/methods.md §1.1, §4.3). The teacher-forced feature pass (features.py) then adds, at every position, the
target's greedy token and its hidden states on exactly these sequences.

Batched `generate` with left padding is ~10x faster per token than batch 1 on CPU; the file is appended batch by
batch, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from evalsuite.target.chat import fit_to_template
from evalsuite.train.data import Conversation


@dataclass(frozen=True)
class GenerationOptions:
    max_prompt_tokens: int = 384
    max_new_tokens: int = 256
    batch_size: int = 32
    # cap on (prompt width + max_new_tokens) x prompts per generate call: long agent contexts (2k-8k tokens) go a
    # few at a time; short chat prompts still go batch_size at a time
    batch_tokens: int = 20480
    # labels of agent-trajectory contexts: "regenerated" (the target writes the reply) or "logged" (the logged agent
    # reply is fed teacher-forced; the feature pass then labels every position with the target's own prediction)
    agent_labels: str = "regenerated"


@dataclass
class Sequence:
    conv_id: str
    prompt_ids: list[int]
    response_ids: list[int]  # ends with a stop token unless `stop` is "length"
    stop: str
    labels: str = "regenerated"  # "logged": response_ids are the logged agent reply (labels = target predictions)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def read_sequences(path: Path) -> list[Sequence]:
    if not Path(path).exists():
        return []
    return [Sequence(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def _batches(todo: list[tuple[str, list[int]]], options: GenerationOptions):
    """Consecutive batches (todo is sorted by length) of at most batch_size prompts and batch_tokens tokens."""
    batch: list[tuple[str, list[int]]] = []
    for item in todo:
        width = max([len(ids) for _, ids in batch] + [len(item[1])])
        if batch and (len(batch) >= options.batch_size
                      or (len(batch) + 1) * (width + options.max_new_tokens) > options.batch_tokens):
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch


def regenerate(target, conversations: list[Conversation], out_path: Path, options: GenerationOptions,
               progress: Callable[[int, int], None] = lambda done, tokens: None) -> dict:
    """Append the target's greedy reply to each conversation to `out_path` (JSONL); skip ids already there."""
    done = {s.conv_id for s in read_sequences(out_path)}
    todo, too_long = [], 0
    for conv in conversations:
        if conv.conv_id in done:
            continue
        messages, _ = fit_to_template(conv.as_messages(), None, target.chat_template or "")
        ids = target.render(messages)  # as the evaluation renders it (tool calls and results as text if needed)
        if len(ids) > options.max_prompt_tokens:
            too_long += 1
            continue
        todo.append((conv.conv_id, ids))
    todo.sort(key=lambda item: len(item[1]))  # similar lengths per batch: less padding
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    stops = target.stop_ids
    new_tokens = 0
    with open(out_path, "a") as fh:
        for batch in _batches(todo, options):
            width = max(len(ids) for _, ids in batch)
            inputs = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids in batch], device=target.device)
            mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in batch], device=target.device)
            with torch.inference_mode():
                out = target.model.generate(input_ids=inputs, attention_mask=mask, do_sample=False,
                                            max_new_tokens=options.max_new_tokens, pad_token_id=pad,
                                            eos_token_id=sorted(stops) or None)
            batch_tokens = 0
            for (conv_id, ids), row in zip(batch, out[:, width:].tolist()):
                response, stop = [], "length"
                for token in row:
                    response.append(token)
                    if token in stops:
                        stop = "eos"
                        break
                batch_tokens += len(response)
                fh.write(json.dumps({"conv_id": conv_id, "prompt_ids": ids, "response_ids": response,
                                     "stop": stop}) + "\n")
            fh.flush()
            new_tokens += batch_tokens
            progress(len(batch), batch_tokens)
    return {"generated": len(todo), "skipped_too_long": too_long, "already_done": len(done),
            "new_tokens": new_tokens}


def logged_replies(target, conversations: list[Conversation], out_path: Path, options: GenerationOptions) -> dict:
    """Append each agent context with its *logged* reply (rendered through the target's template, as the
    evaluation renders assistant turns; cut at the first stop token, at most max_new_tokens) to `out_path`.

    No generation: the feature pass's teacher-forced forward labels every reply position with the target's own
    greedy prediction over the logged text (`benchmarks/label_sources.py` compares this with regeneration)."""
    done = {s.conv_id for s in read_sequences(out_path)}
    stops = target.stop_ids
    written = too_long = tokens = 0
    with open(out_path, "a") as fh:
        for conv in conversations:
            if conv.conv_id in done or not conv.logged_reply:
                continue
            context = conv.as_messages()
            reply = json.loads(conv.logged_reply)
            messages, _ = fit_to_template(context, None, target.chat_template or "")
            ids = target.render(messages)
            if len(ids) > options.max_prompt_tokens:
                too_long += 1
                continue
            both, _ = fit_to_template(context + [reply], None, target.chat_template or "")
            text = target.tokenizer.apply_chat_template(both, tokenize=False, add_generation_prompt=False)
            full = target.tokenizer(text, add_special_tokens=False)["input_ids"]
            if full[:len(ids)] == ids:
                response = full[len(ids):]
            else:  # the template renders the history differently once a reply follows: take the reply's own text
                response = target.tokenizer(both[-1].get("content") or "", add_special_tokens=False)["input_ids"]
                response.append(target.tokenizer.eos_token_id)
            stop = "length"
            for i, token in enumerate(response):
                if token in stops:
                    response, stop = response[:i + 1], "eos"
                    break
            if len(response) > options.max_new_tokens:
                response, stop = response[:options.max_new_tokens], "length"
            if not response:
                continue
            fh.write(json.dumps({"conv_id": conv.conv_id, "prompt_ids": ids, "response_ids": response,
                                 "stop": stop, "labels": "logged"}) + "\n")
            written += 1
            tokens += len(response)
    return {"logged": written, "skipped_too_long": too_long, "logged_tokens": tokens}
