"""DLite: released-format checkpoints load and decode losslessly (G = 1 and 2); the hand-worked block layout and
local positions; history-free drafting; RNN-head proposal distributions; config invariants; mismatch errors."""

from __future__ import annotations

import json

import pytest
import torch

from evalsuite.errors import UserError
from evalsuite.methods.ar import AutoregressiveMethod
from evalsuite.methods.base import get_method
from evalsuite.methods.base import Sampling
from evalsuite.methods.dlite import dlite_layer_ids
from evalsuite.target.model import TargetModel
from tests.helpers import PROMPT, decode, dlite_checkpoint

build = get_method("dlite").factory


@pytest.fixture(scope="module")
def qwen3_target(tiny_qwen3_dir):
    return TargetModel.load(str(tiny_qwen3_dir))


def test_layer_rule_matches_the_reference_examples():
    assert dlite_layer_ids(36, 7) == [0, 1, 9, 17, 26, 34, 35]  # docs/methods.md §1.1 (Python round: 16.5 → 16)
    assert dlite_layer_ids(36, 3) == [0, 17, 35]  # one middle layer: the half-way point 1 + round(16.5)
    assert dlite_layer_ids(4, 4) == [0, 1, 2, 3]
    assert dlite_layer_ids(30, 2) == [0, 29]


@pytest.mark.parametrize("group", [1, 2])
def test_checkpoint_is_lossless(tiny_target, tmp_path, group):
    reference = decode(tiny_target, AutoregressiveMethod(tiny_target.device), PROMPT, 40, k=1).output_ids
    drafter = build(tiny_target, {"drafter": str(dlite_checkpoint(tmp_path / "dl", tiny_target,
                                                                   anchor_group_size=group))})
    info = drafter.describe()
    assert info["weights"] == "checkpoint" and info["anchor_group_size"] == group and info["lm_head"] != "target"
    assert drafter.feature_layers == (0, 1, 2, 3)  # includes the last layer (HF's post-norm state)
    result = decode(tiny_target, drafter, PROMPT, 40, k=7)
    assert result.output_ids == reference
    assert result.steps[0].num_drafted == 7  # block 8: seven mask slots
    assert all(s.draft_history_bytes == 0 for s in result.steps)


@pytest.mark.parametrize("group, positions", [
    (1, [0, 0, 0, 0] + [0] + [1, 2, 3]),  # slots 0; anchor 0; masks 1…B-1
    (2, [0, 0, 0, 0] + [0, 1] + [2, 3, 4]),  # slots max(G-2,0)=0; tokens a-1, a at 0,1; masks 2…G+B-2
])
def test_block_layout_hand_worked(qwen3_target, tmp_path, group, positions):
    """B=4, S=4, anchor 77 at position 5 after [.., 43]: queries are the target embeddings of the last G tokens and
    3 MASK rows; context slots are RMSNorm(pivot features + depth embedding); the last B-1 outputs feed the RNN
    head in order, and the mask at local offset k predicts the token at a+k."""
    path = dlite_checkpoint(tmp_path / "dl", qwen3_target, anchor_group_size=group, block_size=4)
    drafter = build(qwen3_target, {"drafter": str(path)})
    features = torch.randn(5, 4, qwen3_target.hidden_size)
    drafter.start_turn(torch.tensor([1, 40, 41, 42, 43, 77]), features)
    captured, head_inputs = {}, []

    def run_layers(block, context, pos, cache=None):
        assert cache is None  # no draft KV cache, ever
        captured.update(block=block.clone(), context=context.clone(), positions=pos.tolist())
        out = torch.randn_like(block)
        captured["out"] = out
        return out

    head = drafter.model.sequential_head
    original_step = head.step

    def step(previous, hidden, state):
        head_inputs.append((int(previous), hidden.clone()))
        return original_step(previous, hidden, state)

    drafter.model.run_layers, head.step = run_layers, step
    tokens = drafter.propose(3, Sampling(), None).tokens.tolist()
    embed = qwen3_target.embed_tokens
    expected_ids = [43, 77][-group:] + [3, 3, 3]
    torch.testing.assert_close(captured["block"], embed(torch.tensor(expected_ids)))
    depth = drafter.model.layer_depth_embedding(torch.tensor([0, 1, 2, 3]))
    torch.testing.assert_close(captured["context"], drafter.model.context_norm(features[-1] + depth))
    assert captured["positions"] == positions
    if group == 2:  # the RNN state is first seeded with the token before the anchor, zero hidden state
        assert len(head_inputs) == 4 and head_inputs[0][0] == 43 and not head_inputs[0][1].any()
        head_inputs.pop(0)
    assert [p for p, _ in head_inputs] == [77] + tokens[:-1]  # x_0 = anchor, then the chosen drafts
    for (_, hidden), expected in zip(head_inputs, captured["out"][-3:], strict=True):
        torch.testing.assert_close(hidden, expected)  # the last B-1 outputs, in order


@pytest.mark.parametrize("group", [1, 2])
def test_history_free(qwen3_target, tmp_path, group):
    """The proposal depends only on the last accepted token's features (and the last G tokens), not on
    anything earlier: different earlier tokens, different earlier features and a different context length
    give the same block, the same drafts and the same proposal distribution."""
    drafter = build(qwen3_target, {"drafter": str(dlite_checkpoint(tmp_path / "dl", qwen3_target,
                                                                    anchor_group_size=group))})
    generator = torch.Generator().manual_seed(0)
    pivot = torch.randn(4, qwen3_target.hidden_size, generator=generator)
    results = []
    for length in (12, 200):
        ids = torch.randint(4, 250, (length + 1,), generator=generator)
        ids[-2:] = torch.tensor([61, 62])  # the last accepted token and the anchor
        features = torch.randn(length, 4, qwen3_target.hidden_size, generator=generator)
        features[-1] = pivot
        drafter.start_turn(ids, features)
        block = drafter.block_outputs()
        proposal = drafter.propose(7, Sampling(temperature=0.8), torch.Generator().manual_seed(5))
        results.append((block, proposal, drafter.state_bytes()))
        # the same after a commit: only the newest feature row and the newest tokens matter
        drafter.commit(torch.tensor([70, 71, 72]), torch.cat([torch.randn(2, 4, 64, generator=generator),
                                                               pivot[None] * 2]))
        results.append((drafter.block_outputs(), drafter.propose(7, Sampling(), None), drafter.state_bytes()))
    for a, b in ((results[0], results[2]), (results[1], results[3])):
        torch.testing.assert_close(a[0], b[0])
        assert a[1].tokens.tolist() == b[1].tokens.tolist()
        if a[1].probs is not None:
            torch.testing.assert_close(a[1].probs, b[1].probs)
        assert a[2] == b[2] and a[2].history == 0  # no history; working memory independent of context length


def test_proposal_probs_are_the_rnn_head_distribution(qwen3_target, tmp_path):
    drafter = build(qwen3_target, {"drafter": str(dlite_checkpoint(tmp_path / "dl", qwen3_target))})
    drafter.start_turn(torch.tensor(PROMPT), torch.randn(len(PROMPT) - 1, 4, qwen3_target.hidden_size))
    hidden = drafter.block_outputs()
    temperature = 0.6
    proposal = drafter.propose(7, Sampling(temperature=temperature), torch.Generator().manual_seed(3))
    probs = proposal.probs
    assert probs.shape == (7, qwen3_target.vocab_size)
    torch.testing.assert_close(probs.sum(-1), torch.ones(7))
    # recompute the recurrence by hand over the drafted tokens: s_0 = 0, x_0 = anchor
    head = drafter.model.sequential_head
    state, previous, expected = torch.zeros(head.rank), [PROMPT[-1]] + proposal.tokens.tolist()[:-1], []
    for j, token in enumerate(previous):
        e = head.prev_token_embedding.weight[token]
        gate_raw, candidate = (head.state_proj.weight @ torch.cat([state, e]) + head.state_proj.bias).chunk(2)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1 - gate) * torch.tanh(candidate)
        latent = head.state_hidden_mlp.weight @ torch.cat([state, hidden[j]]) + head.state_hidden_mlp.bias
        expected.append(torch.softmax((head.output_proj.weight @ latent) / temperature, dim=-1))
    torch.testing.assert_close(probs, torch.stack(expected), rtol=1e-4, atol=1e-6)
    generator = torch.Generator().manual_seed(3)
    assert [int(torch.multinomial(row, 1, generator=generator)) for row in probs] == proposal.tokens.tolist()
    result = decode(qwen3_target, drafter, PROMPT, 20, k=7, sampling=Sampling(temperature=1.0), seed=2)
    assert result.steps


def test_random_init_default(tiny_target):
    drafter = build(tiny_target, {"drafter": "random", "anchor_group_size": 2})
    info = drafter.describe()
    assert info["weights"] == "random-init" and info["block_size"] == 8 and info["anchor_group_size"] == 2
    assert drafter.feature_layers == tuple(dlite_layer_ids(tiny_target.num_layers, min(7, tiny_target.num_layers)))
    drafter.start_turn(torch.tensor(PROMPT), torch.randn(len(PROMPT) - 1, len(drafter.feature_layers), 64))
    assert drafter.propose(7, Sampling(), None).tokens.numel() == 7
    assert drafter.state_bytes().history == 0


@pytest.mark.parametrize("change, message", [
    (lambda c: c["dlite_config"].update(target_layer_ids=[0, 1, 3, 2]), "first/last"),
    (lambda c: c["dlite_config"].update(model_role="swa_teacher"), "pivot_q_student"),
    (lambda c: c["dlite_config"].update(architecture_version="flashmtp_v0"), "architecture_version"),
    (lambda c: c["dlite_config"].update(sequential_head="mlp"), "only 'rnn'"),
    (lambda c: c["dlite_config"].update(sequential_rank=0), "sequential_rank must be positive"),
    (lambda c: c["dlite_config"].update(anchor_group_size=0), "anchor_group_size"),
    (lambda c: c["dlite_config"].pop("mask_token_id"), "lacks"),
    (lambda c: c.update(block_size=1), "block_size"),
    (lambda c: c.update(hidden_size=48), "hidden size 48"),
    (lambda c: c.update(vocab_size=1000), "vocabulary 1000"),
    (lambda c: c.update(num_target_layers=36) or c["dlite_config"].update(target_layer_ids=[0, 1, 34, 35]),
     "36-layer target"),
    (lambda c: c["dlite_config"].update(mask_token_id=151669), "mask token id 151669"),
])
def test_invariants_and_mismatches_are_one_line_errors(qwen3_target, tmp_path, change, message):
    path = dlite_checkpoint(tmp_path / "dl", qwen3_target)
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=message) as err:
        build(qwen3_target, {"drafter": str(path)})
    assert "\n" not in str(err.value)


def _draft_vocabulary_pair(target, tmp_path, excluded: list[int]):
    """A full-vocabulary checkpoint whose output_proj rows for `excluded` are 0, and the same drafter with a draft
    vocabulary of every other id in a shuffled order (so d2t is not the identity): prev_token_embedding and
    output_proj rows copied from the full one, a last shared row for tokens outside the vocabulary."""
    from safetensors.torch import load_file, save_file

    full = dlite_checkpoint(tmp_path / "full", target)
    tensors = load_file(str(full / "model.safetensors"))
    tensors["sequential_head.output_proj.weight"][excluded] = 0
    save_file(tensors, str(full / "model.safetensors"), metadata={"format": "pt"})
    kept = torch.tensor([i for i in range(target.vocab_size) if i not in excluded])
    kept = kept[torch.randperm(kept.numel(), generator=torch.Generator().manual_seed(1))]
    reduced = dlite_checkpoint(tmp_path / "reduced", target, draft_vocab_size=kept.numel())
    head = "sequential_head."
    small = dict(tensors)
    small[head + "output_proj.weight"] = tensors[head + "output_proj.weight"][kept]
    small[head + "prev_token_embedding.weight"] = torch.cat(
        [tensors[head + "prev_token_embedding.weight"][kept], torch.ones(1, tensors[head + "output_proj.weight"].shape[1])])
    small[head + "d2t"] = kept - torch.arange(kept.numel())
    save_file(small, str(reduced / "model.safetensors"), metadata={"format": "pt"})
    return full, reduced, kept


def test_a_draft_vocabulary_proposes_what_the_full_head_would_and_stays_lossless(qwen3_target, tmp_path):
    """dlite_config.draft_vocab_size: the head's rows are a draft vocabulary mapped back by d2t. Where the full
    head never chooses the ids left out (their rows are 0, the others' maxima positive) and no prompt token is left
    out, the two propose the same target ids at every step; decoding is lossless; at T > 0 the proposal is the
    softmax over the draft rows, scattered to the target ids and 0 elsewhere."""
    excluded = [5, 6, 250, 251, 252]
    assert not set(excluded) & set(PROMPT)
    full_path, reduced_path, kept = _draft_vocabulary_pair(qwen3_target, tmp_path, excluded)
    full, reduced = build(qwen3_target, {"drafter": str(full_path)}), build(qwen3_target, {"drafter": str(reduced_path)})
    assert reduced.describe()["draft_vocab_size"] == qwen3_target.vocab_size - len(excluded)
    assert full.describe()["draft_vocab_size"] == qwen3_target.vocab_size
    features = torch.randn(len(PROMPT) - 1, 4, qwen3_target.hidden_size)
    for drafter in (full, reduced):
        drafter.start_turn(torch.tensor(PROMPT), features)
    greedy = Sampling(temperature=0.0)
    a, b = full.propose(7, greedy, None).tokens, reduced.propose(7, greedy, None).tokens
    assert a.tolist() == b.tolist() and not set(b.tolist()) & set(excluded)

    reference = decode(qwen3_target, AutoregressiveMethod(qwen3_target.device), PROMPT, 30, k=1).output_ids
    result = decode(qwen3_target, reduced, PROMPT, 30, k=7)
    assert result.output_ids == reference
    full_result = decode(qwen3_target, full, PROMPT, 30, k=7)
    assert [s.num_accepted for s in result.steps] == [s.num_accepted for s in full_result.steps]

    reduced.start_turn(torch.tensor(PROMPT), features)
    proposal = reduced.propose(3, Sampling(temperature=0.7), torch.Generator().manual_seed(0))
    assert proposal.probs.shape == (3, qwen3_target.vocab_size)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(3))
    assert float(proposal.probs[:, excluded].abs().sum()) == 0.0
    head = reduced.model.sequential_head
    assert torch.equal(head.target_ids(), kept) and torch.equal(head.to_draft(kept), torch.arange(kept.numel()))
    assert int(head.to_draft(torch.tensor(excluded[0]))) == kept.numel()  # the shared row outside the vocabulary


@pytest.mark.parametrize("change, message", [
    (lambda c, t: c["dlite_config"].update(draft_vocab_size=100000), "draft_vocab_size 100000 must be in 1.."),
    (lambda c, t: t.update({"sequential_head.d2t": -torch.arange(t["sequential_head.d2t"].numel())}), "one-to-one"),
    (lambda c, t: t.pop("sequential_head.d2t"), "d2t"),
])
def test_draft_vocabulary_errors_are_one_line(qwen3_target, tmp_path, change, message):
    from safetensors.torch import load_file, save_file

    _, path, _ = _draft_vocabulary_pair(qwen3_target, tmp_path, [5, 6])
    config = json.loads((path / "config.json").read_text())
    tensors = load_file(str(path / "model.safetensors"))
    change(config, tensors)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=message) as err:
        build(qwen3_target, {"drafter": str(path)})
    assert "\n" not in str(err.value)
