"""Training losses on toy cases small enough to work out by hand."""

import math

import pytest
import torch

from evalsuite.train import losses


def logits_of(*probs):
    return torch.log(torch.tensor(probs, dtype=torch.float32))


def test_position_weights_follow_exp_minus_k_minus_one_over_gamma():
    w = losses.position_weights(4, gamma=2.0)
    assert w.tolist() == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0), math.exp(-1.5)])
    assert losses.position_weights(3, gamma=0).tolist() == [1.0, 1.0, 1.0]


def test_total_variation_of_two_known_distributions():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.25, 0.25, 0.5])
    assert float(losses.total_variation(p, q)) == pytest.approx(0.5)
    assert float(losses.total_variation(p, p)) == 0.0


def test_forward_kl_is_teacher_to_student():
    teacher = logits_of(0.5, 0.5)
    student = logits_of(0.25, 0.75)
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float(losses.forward_kl(teacher[None], student[None], torch.ones(1))) == pytest.approx(expected, abs=1e-6)
    reverse = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert expected != pytest.approx(reverse)  # the direction matters


def test_weighted_cross_entropy_is_a_weighted_mean():
    logits = torch.stack([logits_of(0.25, 0.75), logits_of(0.25, 0.75)])
    labels = torch.tensor([1, 0])
    assert float(losses.weighted_ce(logits, labels, torch.tensor([1.0, 0.0]))) == pytest.approx(-math.log(0.75), abs=1e-6)
    both = (-math.log(0.75) * 1.0 + math.log(4.0) * 3.0) / 4.0
    assert float(losses.weighted_ce(logits, labels, torch.tensor([1.0, 3.0]))) == pytest.approx(both, abs=1e-6)
    zero = losses.weighted_ce(logits, labels, torch.zeros(2))
    assert float(zero) == 0.0


def test_confidence_bce_against_a_soft_label():
    # sigmoid(0) = 0.5, so BCE = -(0.8 ln 0.5 + 0.2 ln 0.5) = ln 2 whatever the label
    assert float(losses.confidence_bce(torch.zeros(1), torch.tensor([0.8]), torch.ones(1))) == pytest.approx(math.log(2))
    # sigmoid(ln 4) = 0.8: BCE = -(0.8 ln 0.8 + 0.2 ln 0.2)
    expected = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))
    got = losses.confidence_bce(torch.tensor([math.log(4.0)]), torch.tensor([0.8]), torch.ones(1))
    assert float(got) == pytest.approx(expected, abs=1e-6)


def test_dspark_loss_combines_ce_l1_and_bce_with_its_weights():
    draft = logits_of(0.25, 0.75)[None]
    target = logits_of(0.5, 0.5)[None]
    labels = torch.tensor([0])
    tv = losses.total_variation(torch.softmax(target, -1), torch.softmax(draft, -1))
    out = losses.dspark_loss(draft, torch.zeros(1), tv, labels, torch.ones(1))
    ce = math.log(4.0)
    l1 = 0.5  # |0.25-0.5| + |0.75-0.5|
    bce = math.log(2.0)  # sigmoid(0) = 0.5 against the label 1 - l1/2 = 0.75
    assert float(out["ce"]) == pytest.approx(ce, abs=1e-6)
    assert float(out["l1"]) == pytest.approx(l1, abs=1e-6)
    assert float(out["bce"]) == pytest.approx(bce, abs=1e-6)
    assert float(out["loss"]) == pytest.approx(0.1 * ce + 0.9 * l1 + 1.0 * bce, abs=1e-6)


def test_greedy_tau_counts_the_accepted_prefix_plus_bonus():
    correct = torch.tensor([[True, True, False], [False, True, True]])
    valid = torch.ones(2, 3, dtype=torch.bool)
    assert losses.greedy_tau(correct, valid) == pytest.approx(1 + (2 + 0) / 2)


def test_tv_to_a_sparse_target_counts_the_draft_mass_outside_the_top_k():
    draft = logits_of(0.5, 0.3, 0.2)[None]
    # target top-2 = tokens 0 and 2 with probs 0.6/0.2, renormalised to 0.75/0.25
    tv = losses.tv_to_sparse_target(draft, torch.tensor([[0, 2]]), torch.tensor([[0.6, 0.2]]))
    expected = 0.5 * (abs(0.75 - 0.5) + abs(0.25 - 0.2) + 0.3)
    assert float(tv[0]) == pytest.approx(expected, abs=1e-6)
    dense = losses.total_variation(torch.tensor([0.75, 0.0, 0.25]), torch.tensor([0.5, 0.3, 0.2]))
    assert float(tv[0]) == pytest.approx(float(dense), abs=1e-6)


def test_sparse_soft_ce_renormalises_the_target():
    draft = logits_of(0.5, 0.3, 0.2)[None]
    got = losses.sparse_soft_ce(draft, torch.tensor([[0, 2]]), torch.tensor([[0.3, 0.1]]), torch.ones(1))
    assert float(got) == pytest.approx(-(0.75 * math.log(0.5) + 0.25 * math.log(0.2)), abs=1e-6)
