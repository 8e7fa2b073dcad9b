"""Off-policy corrections (trainer/offpolicy.py) against hand-computed values, the bound a
forged behaviour logprob cannot pass, and the learning-rate schedule."""

import itertools
import math

import pytest
import torch

from swarmrl.config import load_config
from swarmrl.trainer.loss import GRPOLossInput, grpo_loss
from swarmrl.trainer.offpolicy import OffPolicySettings, behaviour_stats, behaviour_weights
from swarmrl.trainer.trainer import learning_rate
from swarmrl.trainer.update import UpdateSettings


def _weights(rho, mode, mask=None, **kw):
    """Weights for tokens whose behaviour ratio pi_n / mu is `rho` (rows = sequences)."""
    rho = torch.tensor(rho, dtype=torch.float64)
    current = torch.full_like(rho, -1.0)
    behaviour = current - torch.log(rho)
    mask = torch.ones_like(rho) if mask is None else torch.tensor(mask, dtype=torch.float64)
    settings = OffPolicySettings(mode=mode, **{"behaviour_clip": 0.0, **kw})  # the mode alone
    bw = behaviour_weights(current, behaviour, mask, settings)
    return bw, behaviour_stats(bw, current, behaviour, mask)


def test_none_weighs_every_completion_token_one():
    bw, stats = _weights([[0.1, 3.0, 9.0]], "none", mask=[[1, 1, 0]])
    assert bw.weights.tolist() == [[1.0, 1.0, 0.0]]
    assert stats.masked == 0 and stats.tokens == 2


def test_a_tis_cap_of_1_never_weighs_a_token_up():
    # A token whose probability rose since it was sampled, or one whose claimed logprob is
    # forged far below the truth, keeps weight 1.
    bw, stats = _weights([[0.5, 1.0, 1.5, 1e12]], "tis", tis_cap=1.0)
    assert bw.weights.tolist() == [[0.5, 1.0, 1.0, 1.0]]
    assert stats.weight_max == 1.0 and stats.masked == 0


def test_tis_truncates_the_ratio_at_the_cap():
    bw, stats = _weights([[0.5, 1.5, 3.0, 10.0]], "tis", tis_cap=2.0)
    assert bw.weights.tolist() == [[0.5, 1.5, 2.0, 2.0]]
    assert stats.weight_sum == pytest.approx(6.0)
    assert stats.weight_max == 2.0
    assert stats.masked == 0


def test_icepop_keeps_the_ratio_inside_the_band_and_masks_outside():
    bw, stats = _weights([[0.4, 0.51, 1.2, 4.9, 5.1]], "icepop", band=(0.5, 5.0))
    assert bw.weights.tolist() == [
        [0.0, pytest.approx(0.51), pytest.approx(1.2), pytest.approx(4.9), 0.0]
    ]
    assert stats.masked == 2


def test_seq_mask_masks_a_sequence_by_its_geometric_mean_ratio():
    # Row 0: geometric mean of (4, 0.25) = 1 (kept, weight 1 whatever each token's rho).
    # Row 1: geometric mean of (3, 2) = sqrt(6) = 2.45 > 2 (masked whole).
    # Row 2: one token only, masked off the completion mask: gmean over (0.6) = 0.6, kept.
    bw, stats = _weights(
        [[4.0, 0.25], [3.0, 2.0], [0.6, 100.0]], "seq_mask", mask=[[1, 1], [1, 1], [1, 0]]
    )
    assert bw.weights.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]
    assert stats.masked == 2 and stats.tokens == 5


def test_behaviour_clip_masks_tokens_already_moved_in_their_advantages_direction():
    # rho per token; row 0 has A = +1, row 1 A = -1, row 2 A = 0. With c = 0.2: a rewarded
    # token whose probability rose past 1.2x since sampling is masked (1.5, 3.0), one that
    # fell is kept (tis-weighted); a penalised token that fell below 0.8x is masked (0.5).
    rho = torch.tensor([[0.5, 1.1, 1.5, 3.0], [0.5, 0.9, 1.5, 3.0], [0.5, 0.9, 1.5, 3.0]])
    current = torch.full_like(rho, -1.0, dtype=torch.float64)
    behaviour = current - torch.log(rho.double())
    mask = torch.ones_like(current)
    adv = torch.tensor([1.0, -1.0, 0.0])
    settings = OffPolicySettings(mode="tis", tis_cap=2.0, behaviour_clip=0.2)
    bw = behaviour_weights(current, behaviour, mask, settings, adv)
    assert bw.weights.tolist() == [
        [pytest.approx(0.5), pytest.approx(1.1), 0.0, 0.0],
        [0.0, pytest.approx(0.9), pytest.approx(1.5), 2.0],
        [pytest.approx(0.5), pytest.approx(0.9), pytest.approx(1.5), 2.0],
    ]
    assert behaviour_stats(bw, current, behaviour, mask).masked == 3
    # Off (c = 0), the same tokens are tis-weighted only; on, it needs the advantages.
    unclipped = OffPolicySettings(mode="tis", behaviour_clip=0.0)
    off = behaviour_weights(current, behaviour, mask, unclipped, adv)
    assert float(off.kept.sum()) == 12
    with pytest.raises(ValueError, match="advantages"):
        behaviour_weights(current, behaviour, mask, settings)


def test_behaviour_clip_leaves_an_on_policy_step_unchanged():
    current = -torch.rand(3, 5, dtype=torch.float64) - 0.1
    mask = torch.ones_like(current)
    adv = torch.tensor([1.5, -0.5, 0.0])
    clipped = OffPolicySettings(mode="tis", behaviour_clip=0.2)
    bw = behaviour_weights(current, current.clone(), mask, clipped, adv)
    assert bw.weights.tolist() == [[1.0] * 5] * 3


@pytest.mark.parametrize("forged", [-1e30, 1e30, math.nan, -math.inf, math.inf])
def test_behaviour_clip_keeps_a_forged_logprobs_weight_within_the_cap(forged):
    current = torch.tensor([[-1.0, -0.5, -2.0]] * 2, dtype=torch.float64)
    behaviour = current.clone()
    behaviour[:, 1] = forged
    settings = OffPolicySettings(mode="tis", tis_cap=2.0, behaviour_clip=0.2)
    bw = behaviour_weights(
        current, behaviour, torch.ones_like(current), settings, torch.tensor([1.0, -1.0])
    )
    assert torch.isfinite(bw.weights).all()
    assert float(bw.weights.min()) >= 0.0 and float(bw.weights.max()) <= 2.0


def test_kl_estimate_is_k3_of_the_behaviour_ratio():
    rho = [2.0, 0.5]
    _, stats = _weights([rho], "none")
    expected = sum((r - 1) - math.log(r) for r in rho) / 2
    assert stats.kl_sum / stats.finite == pytest.approx(expected)
    _, same = _weights([[1.0, 1.0]], "none")
    assert same.kl_sum == 0.0


@pytest.mark.parametrize("mode", ["tis", "icepop", "seq_mask"])
@pytest.mark.parametrize("forged", [-1e30, 1e30, math.nan, -math.inf, math.inf])
def test_a_forged_behaviour_logprob_is_masked_or_bounded(mode, forged):
    current = torch.tensor([[-1.0, -0.5, -2.0]], dtype=torch.float64)
    behaviour = current.clone()
    behaviour[0, 1] = forged
    mask = torch.ones_like(current)
    settings = OffPolicySettings(
        mode=mode, tis_cap=2.0, band=(0.5, 5.0), seq_band=(0.5, 2.0), behaviour_clip=0.0
    )
    bw = behaviour_weights(current, behaviour, mask, settings)
    bound = {"tis": 2.0, "icepop": 5.0, "seq_mask": 1.0}[mode]
    assert torch.isfinite(bw.weights).all()
    assert float(bw.weights.max()) <= bound
    assert float(bw.weights.min()) >= 0.0
    stats = behaviour_stats(bw, current, behaviour, mask)
    assert math.isfinite(stats.kl_sum) and math.isfinite(stats.weight_sum)


@pytest.mark.parametrize("clip", [0.0, 0.2])
@pytest.mark.parametrize("mode", ["tis", "icepop"])
def test_a_forged_logprob_bounds_its_tokens_gradient_in_the_loss(mode, clip):
    # The loss's gradient with respect to each token's logprob is w_t * (the unweighted
    # gradient): however extreme the claimed sampling logprob, |d loss / d logp_t| stays
    # within bound(mode) * max(delta, 1 + eps) * |A| / budget.
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(4, 6, generator=gen, dtype=torch.float64) - 0.1
    logp = (old + 0.3 * torch.randn(4, 6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([2.0, -2.0, 1.0, -1.0], dtype=torch.float64)
    mask = torch.ones_like(old)
    claimed = old.clone()
    claimed[:, ::2] = -1e6  # the worker claims it sampled these tokens with tiny probability
    settings = OffPolicySettings(mode=mode, tis_cap=2.0, band=(0.5, 5.0), behaviour_clip=clip)
    bw = behaviour_weights(old, claimed, mask, settings, adv)
    budget = 24.0
    out = grpo_loss(
        GRPOLossInput(logp, old, adv, mask, budget, token_weights=bw.weights),
        epsilon=0.2,
        delta=4.0,
    )
    out.loss.backward()
    bound = {"tis": 2.0, "icepop": 5.0}[mode]
    ratio = torch.exp(logp.detach() - old)
    limit = bound * torch.clamp(ratio, max=4.0).max() * adv.abs().max() / budget
    assert float(logp.grad.abs().max()) <= float(limit) + 1e-12
    # The forged columns: tis caps them at 2x, icepop drops them.
    honest = grpo_loss(
        GRPOLossInput(logp.detach(), old, adv, mask, budget),
        epsilon=0.2,
        delta=4.0,
    )
    assert math.isfinite(out.loss.item()) and math.isfinite(honest.loss.item())
    if mode == "icepop":
        assert float(bw.weights[:, ::2].abs().max()) == 0.0


def test_token_weights_scale_each_tokens_loss_and_gradient():
    # A = 1, r = 1 at two tokens, weights (0.5, 2): loss = -(0.5 + 2) / budget.
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    out = grpo_loss(
        GRPOLossInput(
            logp,
            torch.zeros(1, 2, dtype=torch.float64),
            torch.tensor([1.0], dtype=torch.float64),
            torch.ones(1, 2, dtype=torch.float64),
            2.0,
            token_weights=torch.tensor([[0.5, 2.0]], dtype=torch.float64),
        )
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-1.25)
    assert logp.grad.tolist() == [[pytest.approx(-0.25), pytest.approx(-1.0)]]


def test_learning_rate_warms_up_then_decays_to_the_final_ratio_on_the_last_step():
    total, warm = 100, 4
    lrs = [learning_rate(i, 1e-3, warm, total, "cosine", 0.1) for i in range(total)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))
    midpoint = warm + (total - warm - 1) / 2  # cos = 0 halfway: lr = final + (1 - final) / 2
    assert learning_rate(int(midpoint), 1, warm, total, "cosine", 0.1) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (int(midpoint) - warm) / (total - warm - 1)))
    )
    assert [learning_rate(i, 1e-3, warm, total, "constant", 0.1) for i in (4, 50, 99)] == [1e-3] * 3


def test_a_step_trains_on_what_it_has_after_reading_max_read_ratio_batches():
    from swarmrl.config import TrainerConfig
    from swarmrl.trainer.batches import BatchCollector
    from swarmrl.trainer.trainer import enough

    tc = TrainerConfig(batch_samples=128, max_read_ratio=4.0)
    c = BatchCollector(step=5, async_level=2)
    c.all_rewards = [1.0] * 511
    assert not enough(c, tc)  # nothing usable: keep reading, however much was read
    c.groups = [[None] * 8]  # type: ignore[list-item]  # one group with signal
    assert not enough(c, tc)  # 511 read < 4 x 128
    c.all_rewards.append(0.0)
    assert enough(c, tc)
    assert not enough(c, TrainerConfig(batch_samples=128, max_read_ratio=0))  # the paper's rule
    c.groups = [[None] * 8] * 16  # type: ignore[list-item]
    assert enough(c, TrainerConfig(batch_samples=128, max_read_ratio=0))  # a full batch


def test_one_default_correction_the_run_configs():
    """The update's default correction is what a default run's trainer uses: tis."""
    from_run = OffPolicySettings.of(load_config(None, {}).trainer)
    assert from_run.mode == "tis" and from_run.behaviour_clip == 0.3
    assert OffPolicySettings() == from_run
    update = UpdateSettings(0.6, 48, 0.2, 4.0, 0.0, 1.0, None)
    assert update.off_policy == from_run
    changed = load_config(None, {"trainer.off_policy": "icepop", "trainer.tis_cap": 3.0})
    assert OffPolicySettings.of(changed.trainer) == OffPolicySettings(mode="icepop", tis_cap=3.0)
