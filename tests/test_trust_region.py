"""The trust region on each optimizer step (trainer/trust_region.py, update.py).

The KL estimate and the line search's step fractions against hand-computed values; then
a real update of a tiny Llama whose learning rate is far too large: the step it takes
under the trust region lies on the full step's own line (start + β × full step), its KL
measured independently is within the bound, and without the bound the same step is far
past it.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from helpers import random_model
from swarmrl.trainer.batches import token_samples
from swarmrl.trainer.distributed import Ranks
from swarmrl.trainer.trust_region import SAFETY, kl_sum, next_scale
from swarmrl.trainer.update import UpdateSettings, forward_logprobs, pad_batch, rollout_update


def test_kl_sum_is_the_k3_estimate_over_completion_tokens():
    before = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    after = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # r = 0.5 -> (0.5 - 1) - log 0.5 = 0.193147; r = 2 -> 1 - log 2 = 0.306853
    assert kl_sum(before, after, mask) == pytest.approx(0.193147 + 0.306853, abs=1e-6)
    assert kl_sum(before, before, mask) == 0.0


def test_a_token_the_step_made_impossible_makes_the_kl_infinite():
    before = torch.log(torch.tensor([[0.5, 0.5]]))
    after = torch.tensor([[-math.inf, math.log(0.5)]])
    assert kl_sum(before, after, torch.ones(1, 2)) == math.inf
    assert next_scale(1.0, math.inf, 0.01) == 0.25


def test_next_scale_follows_the_quadratic_model_inside_the_bound():
    # KL 0.04 against 0.01: the quadratic model says half the step, aimed 10% inside.
    assert next_scale(1.0, 0.04, 0.01) == pytest.approx(0.5 * SAFETY)
    assert next_scale(0.5, 0.16, 0.01) == pytest.approx(0.5 * 0.25 * SAFETY)


def _setup(seed: int = 0):
    model, tok = random_model("llama", hidden=32, layers=2, seed=seed)
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, len(tok)) for _ in range(4)] for _ in range(8)]
    completions = [[rng.randrange(3, len(tok)) for _ in range(10)] for _ in range(8)]
    advantages = [1.0 if i % 2 else -1.0 for i in range(8)]
    return model, tok, token_samples(prompts, completions, advantages)


def _settings(bound: float, proximal: str = "step") -> UpdateSettings:
    return UpdateSettings(
        temperature=1.0,
        max_new_tokens=10,
        epsilon=0.2,
        delta=4.0,
        entropy_coef=0.0,
        grad_clip=1e9,
        micro_batch_samples=None,
        max_update_kl=bound,
        proximal=proximal,  # type: ignore[arg-type]
    )


def _step(model, tok, samples, bound: float, lr: float):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    return rollout_update(
        model, opt, samples, [list(range(8))], [lr], _settings(bound), Ranks(), tok.pad_token_id
    )


def _kl(model_a, model_b, tok, samples) -> float:
    ids, targets, mask = pad_batch(samples, tok.pad_token_id)
    with torch.no_grad():
        a = forward_logprobs(model_a, ids, targets, 1.0)[0]
        b = forward_logprobs(model_b, ids, targets, 1.0)[0]
    return kl_sum(a, b, mask) / float(mask.sum())


def test_a_step_past_the_bound_is_pulled_back_along_its_own_direction():
    bound, lr = 0.01, 0.05  # lr far too large: one Adam step moves the policy a lot
    model, tok, samples = _setup()
    start = copy.deepcopy(model)
    full = copy.deepcopy(model)
    free = _step(full, tok, samples, 0.0, lr)
    assert free.update_scale == 1.0 and free.update_kl == 0.0  # off: nothing measured
    assert _kl(start, full, tok, samples) > 5 * bound

    stats = _step(model, tok, samples, bound, lr)
    assert 0.0 < stats.update_scale < 1.0
    assert stats.update_kl_full == pytest.approx(_kl(start, full, tok, samples), rel=1e-4)
    assert _kl(start, model, tok, samples) == pytest.approx(stats.update_kl, rel=1e-4)
    assert stats.update_kl <= bound
    beta = stats.update_scale
    for p, p0, p1 in zip(model.parameters(), start.parameters(), full.parameters(), strict=True):
        torch.testing.assert_close(p, p0 + beta * (p1 - p0), rtol=1e-5, atol=1e-7)


def test_a_step_within_the_bound_is_kept_whole():
    model, tok, samples = _setup(seed=1)
    full = copy.deepcopy(model)
    _step(full, tok, samples, 0.0, 1e-5)
    stats = _step(model, tok, samples, 1.0, 1e-5)
    assert stats.update_scale == 1.0
    assert 0.0 < stats.update_kl == stats.update_kl_full < 1.0
    for p, p1 in zip(model.parameters(), full.parameters(), strict=True):
        torch.testing.assert_close(p, p1)


def test_the_first_minibatch_takes_its_old_logprobs_from_its_own_forward():
    # Two minibatches, one micro-batch each: the second needs the step's start policy in a
    # pass before the first update; the first is that policy, so its own forward serves.
    model, tok, samples = _setup(seed=2)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = rollout_update(
        model,
        opt,
        samples,
        [list(range(4)), list(range(4, 8))],
        [1e-3, 1e-3],
        _settings(0.0),
        Ranks(),
        tok.pad_token_id,
    )
    assert calls == [False, True, True]  # was [False, False, True, True]
    assert math.isfinite(stats.loss) and stats.trained_tokens == 80


@pytest.mark.parametrize("proximal", ["step", "minibatch"])
def test_a_minibatch_proximal_policy_needs_no_extra_pass_and_never_clips(proximal):
    # proximal "minibatch": each minibatch is its own old policy, so no pass before the
    # first update, and its ratio is 1 (nothing clipped however far the first step moved);
    # "step": the second minibatch's ratio is taken against the step's start, and with a
    # learning rate far too large its tokens leave the clip's band.
    model, tok, samples = _setup(seed=3)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    stats = rollout_update(
        model,
        opt,
        samples,
        [list(range(4)), list(range(4, 8))],
        [0.05, 0.05],
        _settings(0.0, proximal),
        Ranks(),
        tok.pad_token_id,
    )
    if proximal == "minibatch":
        assert calls == [True, True]
        assert stats.clip_ratio == 0.0
    else:
        assert calls == [False, True, True]
        assert stats.clip_ratio > 0.0
    assert math.isfinite(stats.loss) and stats.trained_tokens == 80


def test_an_unknown_proximal_policy_is_refused():
    model, tok, samples = _setup(seed=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="proximal"):
        rollout_update(
            model,
            opt,
            samples,
            [list(range(8))],
            [1e-3],
            _settings(0.0, "nearby"),
            Ranks(),
            tok.pad_token_id,
        )
