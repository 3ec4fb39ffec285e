"""The decode loop: losslessness at T=0, distribution preservation at T>0, step bookkeeping."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from evalsuite.engines.acceptance import accept_greedy, accept_rejection, target_probs
from evalsuite.methods.ar import AutoregressiveMethod
from evalsuite.methods.base import Sampling
from evalsuite.methods.ngram import PromptLookupMethod
from evalsuite.target.model import TargetModel
from evalsuite.testing import tiny_config
from tests.helpers import PROMPTS, OracleMethod, RandomMethod, decode


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_autoregressive(tiny_target, prompt):
    reference = decode(tiny_target, AutoregressiveMethod(tiny_target.device), prompt, 48)
    for drafter in (PromptLookupMethod(tiny_target.device), RandomMethod(tiny_target.vocab_size)):
        for k in (1, 3, 7):
            result = decode(tiny_target, drafter, prompt, 48, k=k)
            assert result.output_ids == reference.output_ids, (drafter.name, k)


def test_ngram_gets_real_acceptance_on_repetitive_text(tiny_target):
    """The tiny random model falls into loops quickly; prompt lookup must then accept drafts."""
    result = decode(tiny_target, PromptLookupMethod(tiny_target.device), PROMPTS[1], 120, k=5)
    assert sum(s.num_accepted for s in result.steps) > 0


def test_step_bookkeeping(tiny_target):
    prompt = PROMPTS[0]
    reference = decode(tiny_target, AutoregressiveMethod(tiny_target.device), prompt, 40)
    # The oracle knows the answer except at output index 3, which the first step drafts (slots 1..4).
    future = list(reference.output_ids)
    wrong = future[:3] + [(future[3] + 1) % tiny_target.vocab_size] + future[4:]
    result = decode(tiny_target, OracleMethod(wrong), prompt, 40, k=4)
    assert result.output_ids == reference.output_ids
    context = len(prompt)
    for step in result.steps:
        assert step.context_len == context, "context_len is the KV length when the step starts"
        assert step.emitted == step.num_accepted + 1 or step is result.steps[-1]
        context += step.emitted
    assert context == len(prompt) + len(result.output_ids) - 1  # the last token is never run through the target
    assert (result.steps[0].num_drafted, result.steps[0].num_accepted) == (4, 2)
    assert all(s.num_accepted == s.num_drafted for s in result.steps[1:])
    assert sum(s.emitted for s in result.steps) + 1 == len(result.output_ids)


def test_max_new_tokens_is_exact(tiny_target):
    for limit in (1, 2, 13):
        result = decode(tiny_target, PromptLookupMethod(tiny_target.device), PROMPTS[0], limit, k=7)
        assert len(result.output_ids) == limit and result.stop_reason == "max_new_tokens"


def test_eos_inside_accepted_drafts_ends_the_turn(tiny_target):
    """Declare the model's 4th greedy token a stop token: the output must end right there, even though the
    step that accepts it drafted further."""
    reference = decode(tiny_target, AutoregressiveMethod(tiny_target.device), PROMPTS[2], 12).output_ids
    stop = reference[3]
    original = tiny_target.chat.stop_ids
    tiny_target.chat.stop_ids = frozenset({stop})
    try:
        result = decode(tiny_target, OracleMethod(reference), PROMPTS[2], 12, k=7)
    finally:
        tiny_target.chat.stop_ids = original
    assert result.stop_reason == "eos"
    assert result.output_ids == reference[: reference.index(stop) + 1]
    # the first step drafts reference[1..7], all accepted by the target; only those up to the EOS count
    first = result.steps[0]
    assert first.num_drafted == 7 and first.num_accepted == reference.index(stop) == first.emitted


def test_a_step_with_no_room_to_draft_is_budget_limited(tiny_target):
    """The last token of the budget comes from a plain one-token step: marked, so τ can leave it out."""
    reference = decode(tiny_target, AutoregressiveMethod(tiny_target.device), PROMPTS[2], 12).output_ids
    result = decode(tiny_target, OracleMethod(reference), PROMPTS[2], 10, k=4)
    # drafts 4+1, 4+1 → 1 + 5 + 5 > 10: the budget caps the second step at 3 drafts, leaving no room after
    assert [(s.num_drafted, s.budget_limited) for s in result.steps] == [(4, False), (3, False)]
    result = decode(tiny_target, OracleMethod(reference), PROMPTS[2], 7, k=4)
    assert [(s.num_drafted, s.budget_limited) for s in result.steps] == [(4, False), (0, True)]
    assert result.output_ids == reference[:7]


def test_accept_greedy_rule():
    logits = torch.full((4, 5), -1.0)
    for row, choice in enumerate([3, 1, 4, 2]):
        logits[row, choice] = 1.0
    assert accept_greedy(torch.tensor([3, 1, 4]), logits) == (3, 2)
    assert accept_greedy(torch.tensor([3, 0, 4]), logits) == (1, 1)
    assert accept_greedy(torch.tensor([0, 1, 4]), logits) == (0, 3)
    assert accept_greedy(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 3)


def test_rejection_sampling_preserves_target_distribution_unit():
    """Context-free target: the first emitted token must follow p0 and the second p1, whatever q is."""
    gen = torch.Generator().manual_seed(7)
    vocab, k = 6, 2
    logits = torch.randn(k + 1, vocab, generator=gen) * 1.5
    p = target_probs(logits, Sampling(temperature=1.0))
    q = torch.softmax(torch.randn(k, vocab, generator=gen), dim=-1)
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    trials = 20000
    for _ in range(trials):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=gen)[0] for i in range(k)])
        accepted, bonus = accept_rejection(drafts, q, logits, Sampling(temperature=1.0), gen)
        emitted = drafts[:accepted].tolist() + [bonus]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    assert chisquare(first, p[0].double() / p[0].double().sum() * trials).pvalue > 1e-3
    assert chisquare(second, p[1].double() / p[1].double().sum() * second.sum()).pvalue > 1e-3


def _tiny_vocab_target(vocab: int = 6) -> TargetModel:
    from transformers import LlamaForCausalLM

    torch.manual_seed(3)
    config = tiny_config("llama", vocab_size=vocab, hidden_size=32, layers=2, heads=2, kv_heads=1, intermediate=64)
    config.eos_token_id = None
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return TargetModel(model, tokenizer=None, name="tiny-vocab", model_dir="", device=torch.device("cpu"),
                       dtype=torch.float32)


def test_rejection_sampling_end_to_end_matches_target_distribution():
    """T=1 on a 6-token model: the joint law of the 3 generated tokens, sampled through speculative decoding
    with a bad random drafter, matches the exact target law computed by enumeration."""
    target = _tiny_vocab_target()
    vocab, prompt = target.vocab_size, [1, 2, 3]
    sampling = Sampling(temperature=1.0)
    exact = {}
    for seq in itertools.product(range(vocab), repeat=3):
        ids = torch.tensor(prompt + list(seq[:2]))
        with torch.no_grad():
            probs = torch.softmax(target.model(ids.view(1, -1)).logits[0, -3:].float(), dim=-1)
        exact[seq] = float(probs[0, seq[0]] * probs[1, seq[1]] * probs[2, seq[2]])
    counts = dict.fromkeys(exact, 0)
    trials = 3000
    drafter = RandomMethod(vocab, seed=11)
    for trial in range(trials):
        result = decode(target, drafter, prompt, 3, k=2, sampling=sampling, seed=trial)
        counts[tuple(result.output_ids)] += 1
    # pool rare outcomes so that every expected count is >= 5
    observed, expected, rest_o, rest_e = [], [], 0, 0.0
    for seq, prob in exact.items():
        if prob * trials >= 5:
            observed.append(counts[seq])
            expected.append(prob * trials)
        else:
            rest_o += counts[seq]
            rest_e += prob * trials
    observed.append(rest_o)
    expected.append(rest_e)
    total = sum(expected)
    expected = [e * trials / total for e in expected]  # float rounding only: the exact law sums to 1
    assert chisquare(observed, expected).pvalue > 1e-3
