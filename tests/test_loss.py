"""The GRPO loss against hand-computed numbers (docs/architecture.md §3)."""

import math

import pytest
import torch

from swarmrl.trainer.loss import GRPOLossInput, grpo_loss, token_logprobs
from swarmrl.trainer.update import token_budget


def _loss(ratios, advantage, mask=None, budget=1.0, eps=0.2, delta=4.0):
    ratios = torch.tensor([ratios], dtype=torch.float64)
    logp = torch.log(ratios).requires_grad_(True)
    mask = torch.ones_like(ratios) if mask is None else torch.tensor([mask], dtype=torch.float64)
    out = grpo_loss(
        GRPOLossInput(
            logprobs=logp,
            old_logprobs=torch.zeros_like(ratios),
            advantages=torch.tensor([advantage], dtype=torch.float64),
            mask=mask,
            token_budget=budget,
        ),
        epsilon=eps,
        delta=delta,
    )
    out.loss.backward()
    return out, logp.grad[0].tolist()


def test_negative_advantage_ratio_is_capped_at_delta():
    # A = -1, r = 5: min(min(5, 4) * -1, clip(5) * -1) = min(-4, -1.2) = -4 -> loss 4 (not 5).
    out, grad = _loss([5.0], -1.0)
    assert out.loss.item() == pytest.approx(4.0)
    assert grad == [pytest.approx(0.0)]  # capped: no gradient flows
    assert out.clip_ratio.item() == 1.0


def test_negative_advantage_below_delta_is_unclipped_upwards():
    # A = -1, r = 1.5: min(-1.5, -1.2) = -1.5 -> loss 1.5, d loss / d logp = A * r * -1 = 1.5
    out, grad = _loss([1.5], -1.0)
    assert out.loss.item() == pytest.approx(1.5)
    assert grad == [pytest.approx(1.5)]
    assert out.clip_ratio.item() == 0.0


def test_epsilon_clip_for_positive_advantage():
    # A = 2, r = 1.5: min(3.0, 1.2 * 2 = 2.4) = 2.4 -> loss -2.4, flat in r.
    out, grad = _loss([1.5], 2.0)
    assert out.loss.item() == pytest.approx(-2.4)
    assert grad == [pytest.approx(0.0)]
    # A = 2, r = 0.5: min(1.0, 0.8 * 2 = 1.6) = 1.0 -> loss -1.0, gradient -A*r = -1.0.
    out, grad = _loss([0.5], 2.0)
    assert out.loss.item() == pytest.approx(-1.0)
    assert grad == [pytest.approx(-1.0)]


def test_epsilon_clip_for_negative_advantage_small_ratio():
    # A = -1, r = 0.5: min(-0.5, 0.8 * -1 = -0.8) = -0.8 -> loss 0.8, flat.
    out, grad = _loss([0.5], -1.0)
    assert out.loss.item() == pytest.approx(0.8)
    assert grad == [pytest.approx(0.0)]


def test_constant_token_budget_normalization_and_masking():
    # Three tokens, the first masked (a prompt token with a wild ratio), budget 10.
    # Unmasked: r = 1.0 and 1.1 with A = 1 -> per-token losses -1.0 and -1.1 -> sum -2.1 / 10.
    out, grad = _loss([100.0, 1.0, 1.1], 1.0, mask=[0.0, 1.0, 1.0], budget=10.0)
    assert out.loss.item() == pytest.approx(-0.21)
    assert grad[0] == 0.0
    assert grad[1] == pytest.approx(-0.1) and grad[2] == pytest.approx(-0.11)
    # The same tokens under a different budget scale exactly, whatever the length.
    out2, _ = _loss([100.0, 1.0, 1.1], 1.0, mask=[0.0, 1.0, 1.0], budget=20.0)
    assert out2.loss.item() == pytest.approx(-0.105)


def test_token_normalization_is_not_per_sequence():
    # Two samples, lengths 1 and 3, all ratios 1, advantages +1: sum of token losses = -4.
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 0, 0], [1.0, 1.0, 1.0]])
    out = grpo_loss(
        GRPOLossInput(
            logprobs=logp,
            old_logprobs=logp,
            advantages=torch.tensor([1.0, 1.0]),
            mask=mask,
            token_budget=6.0,
        )
    )
    # Per-sequence mean would give -(1 + 1) / 2 = -1; token level over a constant budget gives -4/6.
    assert out.loss.item() == pytest.approx(-4 / 6)


def test_token_logprobs_divides_by_temperature():
    logits = torch.tensor([[[2.0, 0.0]]])
    lp, ent = token_logprobs(logits, torch.tensor([[0]]), temperature=0.5)
    expected = 4.0 - math.log(math.exp(4.0) + 1.0)
    assert lp.item() == pytest.approx(expected, rel=1e-5)
    p = math.exp(expected)
    assert ent.item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)), rel=1e-5)


def test_parts_over_the_whole_budget_sum_to_the_whole_loss_and_gradient():
    # What lets ranks and micro-batches share a minibatch (trainer/update.py): each part
    # divided by the whole minibatch's budget; a part's own budget would not add up.
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(5, 4, generator=gen, dtype=torch.float64)).requires_grad_(True)
    old = -torch.rand(5, 4, generator=gen, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7], dtype=torch.float64)
    mask = (torch.rand(5, 4, generator=gen) > 0.3).double()
    budget = token_budget(5, 4)

    def loss(rows: slice, budget: float) -> torch.Tensor:
        inp = GRPOLossInput(logp[rows], old[rows], adv[rows], mask[rows], budget)
        return grpo_loss(inp, epsilon=0.1, delta=1.2).loss

    whole = loss(slice(0, 5), budget)
    (whole_grad,) = torch.autograd.grad(whole, logp)
    parts = [loss(slice(0, 3), budget), loss(slice(3, 5), budget)]
    (parts_grad,) = torch.autograd.grad(sum(parts), logp)
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-12)
    assert torch.allclose(parts_grad, whole_grad, rtol=1e-12, atol=0)
    per_part = [loss(slice(0, 3), token_budget(3, 4)), loss(slice(3, 5), token_budget(2, 4))]
    assert float(sum(per_part)) / 2 != pytest.approx(float(whole), rel=1e-3)
