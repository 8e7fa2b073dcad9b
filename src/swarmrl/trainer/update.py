"""One rollout step's GRPO update, split over ranks and micro-batches, normalized globally.

The step's samples are shuffled and dealt into `optimizer_steps` minibatches; each
minibatch is one optimizer step. Within a minibatch of B samples on W ranks:
- rank r takes samples r, r+W, r+2W, ... and cuts its share into micro-batches of at
  most `micro_batch_samples`;
- each micro-batch's summed token losses are divided by the minibatch's constant token
  budget B x max_new_tokens (`token_budget`: the whole minibatch, never the rank's or the
  micro-batch's part), gradients accumulate over micro-batches and are summed over ranks.
So the gradient is the sum over all of the minibatch's completion tokens divided by one
constant: the same update as one process on the whole minibatch, whatever W and the
micro-batching (tests/test_trainer_distributed.py checks it to 1e-5).

The loss's "old" logprobs are those of its proximal policy (`proximal`). By default
(`minibatch`) that is the live policy at each minibatch: its own forward's, detached, so
the ratio is 1 and no extra pass is run. With `step` it is policy n at the step's start:
recomputed the same way, each rank for its own share, in a no-grad pass before the first
update for every minibatch but the first (the first minibatch's are its own forward's:
the policy has not moved yet). Against them, each token's loss is weighted by the
off-policy correction (offpolicy.py) of the worker's recorded sampling logprob: the
samples were drawn by an older policy than n in an asynchronous run. FSDP's gathers are
collectives, so every rank runs the same number of micro-batches: a rank whose share is
shorter runs a masked-out one that adds nothing to the loss or the gradient.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
import torch

from swarmrl.config.sections import ProximalMode, TrainerConfig
from swarmrl.trainer.batches import Sample
from swarmrl.trainer.distributed import Ranks, all_max, all_sum, grad_norm_value
from swarmrl.trainer.loss import GRPOLossInput, grpo_loss, token_logprobs
from swarmrl.trainer.offpolicy import (
    BehaviourStats,
    OffPolicySettings,
    behaviour_stats,
    behaviour_weights,
)
from swarmrl.trainer.trust_region import MAX_SHRINKS, kl_sum, next_scale


@dataclass(frozen=True)
class UpdateSettings:
    temperature: float
    max_new_tokens: int
    epsilon: float
    delta: float
    entropy_coef: float
    grad_clip: float
    micro_batch_samples: int | None  # None: a rank's whole share in one pass
    off_policy: OffPolicySettings = field(default_factory=OffPolicySettings)
    max_update_kl: float = 0.0  # trust region on each optimizer step's KL per token; 0 = off
    proximal: ProximalMode = TrainerConfig().proximal  # the ratio's policy (run config's default)
    # bf16 matrix products under torch.autocast, weights and optimizer fp32: the
    # one-process trainer's `precision = bf16` (the sharded one casts through FSDP2)
    autocast_bf16: bool = False


@dataclass(frozen=True)
class UpdateStats:
    """One rollout step's update, global over ranks: the `StepMetrics` fields of the same
    names in `metrics.jsonl`."""

    loss: float  # mean over the step's optimizer steps of the summed micro-batch losses
    grad_norm: float  # mean gradient norm before clipping
    grad_norm_max: float
    clip_ratio: float  # share of completion tokens whose ratio was clipped
    entropy: float  # mean per completion token
    trained_tokens: int
    lr: float  # the rate of the step's last optimizer step
    is_weight_mean: float  # mean off-policy weight over completion tokens
    is_weight_max: float
    is_masked_share: float  # share of completion tokens the off-policy correction masked
    behaviour_kl: float  # k3 estimate of KL(sampling policy || policy n) per token
    update_kl: float  # mean KL per token each optimizer step left (0: trust region off)
    update_kl_full: float  # largest KL per token an optimizer step made before shrinking
    update_scale: float  # smallest fraction of an optimizer step kept (1: none shrunk)


def token_budget(minibatch_samples: int, max_new_tokens: int) -> float:
    """Dr. GRPO's constant normalizer of one optimizer step: every sample of the minibatch,
    on every rank, times the completion length limit."""
    return float(minibatch_samples * max_new_tokens)


def deal_minibatches(n_samples: int, optimizer_steps: int) -> list[list[int]]:
    """Sample indices, shuffled with the global `random` state (saved with the trainer
    state), dealt round-robin into at most `optimizer_steps` non-empty minibatches."""
    order = list(range(n_samples))
    random.shuffle(order)
    return [mb for mb in (order[i::optimizer_steps] for i in range(optimizer_steps)) if mb]


def micro_batches(minibatch: list[int], ranks: Ranks, size: int | None) -> list[list[int]]:
    """This rank's micro-batches of a minibatch; the same count on every rank, padded with
    empty ones where this rank's share is shorter."""
    share = minibatch[ranks.rank :: ranks.world]
    longest = math.ceil(len(minibatch) / ranks.world)
    size = size or longest
    count = math.ceil(longest / size)
    return [share[i * size : (i + 1) * size] for i in range(count)]


def pad_batch(
    samples: list[Sample], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L], the completion tokens' targets [B, L-1] and mask [B, L-1]."""
    seqs = [s.input_tokens + s.output_tokens for s in samples]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1))
    for i, (s, seq) in enumerate(zip(samples, seqs, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        # Logits at position j predict token j+1: completion tokens are predicted from
        # positions len(prompt)-1 .. len(seq)-2.
        mask[i, len(s.input_tokens) - 1 : len(seq) - 1] = 1.0
    return ids, ids[:, 1:], mask


def pad_behaviour(samples: list[Sample], width: int) -> torch.Tensor:
    """The workers' sampling logprobs [B, width] laid out like `pad_batch`'s mask (0 off
    it); the values are claims, taken as float64 so a forged one cannot overflow here."""
    out = torch.zeros((len(samples), width), dtype=torch.float64)
    for i, s in enumerate(samples):
        start = len(s.input_tokens) - 1
        claimed = torch.tensor(s.output_logprobs, dtype=torch.float64)
        out[i, start : start + len(claimed)] = claimed
    return out


def forward_logprobs(model, ids, targets, temperature, bf16: bool = False):
    # Right padding keeps every real token's causal context free of pads: no mask needed.
    # Under autocast only the matrix products run in bf16; the logprobs are taken in fp32.
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    return token_logprobs(logits, targets, temperature)


@dataclass(frozen=True)
class _Micro:
    ids: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    behaviour: torch.Tensor  # [B, L-1] the sampler's claimed logprobs (float64)


def _micro(samples: list[Sample], idx: list[int], filler: int, pad: int, device) -> _Micro:
    # An empty micro-batch still runs the forward and backward passes (the collectives
    # inside them), on one real sample whose tokens are all masked out.
    chosen = [samples[i] for i in idx] or [samples[filler]]
    ids, targets, mask = pad_batch(chosen, pad)
    if not idx:
        mask.zero_()
    return _Micro(
        ids.to(device),
        targets.to(device),
        mask.to(device),
        torch.tensor([s.advantage for s in chosen], device=device),
        pad_behaviour(chosen, mask.shape[1]).to(device),
    )


def rollout_update(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    samples: list[Sample],
    minibatches: list[list[int]],
    lrs: list[float],
    settings: UpdateSettings,
    ranks: Ranks,
    pad_id: int,
) -> UpdateStats:
    """Take one optimizer step per minibatch (learning rate `lrs[i]` for the i-th); every
    rank calls it with the same samples and minibatches. Returns the step's statistics,
    global over ranks."""
    s = settings
    plans = [micro_batches(mb, ranks, s.micro_batch_samples) for mb in minibatches]
    micros = [
        [_micro(samples, idx, mb[0], pad_id, ranks.device) for idx in plan]
        for mb, plan in zip(minibatches, plans, strict=True)
    ]
    # With proximal "minibatch" every minibatch is its own old policy (None: its
    # forward's, detached), and no pass is needed. With "step" the old policy is the one
    # at the step's start; for the first minibatch that is the live policy (nothing has
    # moved yet), so only the later minibatches need a pass before the first update.
    old: list[list[torch.Tensor | None]] = [[None] * len(mb_micros) for mb_micros in micros]
    if s.proximal == "step":
        model.eval()
        with torch.no_grad():
            old[1:] = [
                [
                    forward_logprobs(model, m.ids, m.targets, s.temperature, s.autocast_bf16)[0]
                    for m in mb_micros
                ]
                for mb_micros in micros[1:]
            ]
    elif s.proximal != "minibatch":
        raise ValueError(f"unknown proximal policy {s.proximal!r}")
    model.train()
    behaviour = []
    grad_norms, clip_ratios, entropies, losses, tokens = [], [], [], [], 0
    update_kls, full_kls, scales = [], [], []
    for mb, mb_micros, mb_old, lr in zip(minibatches, micros, old, lrs, strict=True):
        budget = token_budget(len(mb), s.max_new_tokens)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss_sum = token_sum = clipped_sum = entropy_sum = 0.0
        before = []
        for m, old_logprobs in zip(mb_micros, mb_old, strict=True):
            logprobs, entropy = forward_logprobs(
                model, m.ids, m.targets, s.temperature, s.autocast_bf16
            )
            if old_logprobs is None:
                old_logprobs = logprobs.detach()
            if s.max_update_kl > 0:
                before.append(logprobs.detach())
            w = behaviour_weights(old_logprobs, m.behaviour, m.mask, s.off_policy, m.advantages)
            behaviour.append(behaviour_stats(w, old_logprobs, m.behaviour, m.mask))
            out = grpo_loss(
                GRPOLossInput(
                    logprobs=logprobs,
                    old_logprobs=old_logprobs,
                    advantages=m.advantages,
                    mask=m.mask,
                    token_budget=budget,
                    entropy=entropy,
                    token_weights=w.weights,
                ),
                epsilon=s.epsilon,
                delta=s.delta,
                entropy_coef=s.entropy_coef,
            )
            out.loss.backward()
            n = float(m.mask.sum())
            loss_sum += float(out.loss.detach())
            token_sum += n
            clipped_sum += float(out.clip_ratio) * n
            entropy_sum += float(out.mean_entropy) * n
        grad_norms.append(
            grad_norm_value(torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip))
        )
        if s.max_update_kl > 0:
            start = [p.detach().clone() for p in model.parameters()]
            opt.step()
            kl_left, kl_full, scale = _trust_region(model, start, mb_micros, before, s, ranks)
            update_kls.append(kl_left)
            full_kls.append(kl_full)
            scales.append(scale)
        else:
            opt.step()
        loss_sum, token_sum, clipped_sum, entropy_sum = all_sum(
            ranks, [loss_sum, token_sum, clipped_sum, entropy_sum]
        )
        losses.append(loss_sum)
        clip_ratios.append(clipped_sum / max(token_sum, 1.0))
        entropies.append(entropy_sum / max(token_sum, 1.0))
        tokens += round(token_sum)
    model.eval()
    weight_mean, weight_max, masked_share, kl = _behaviour_figures(ranks, behaviour)
    return UpdateStats(
        loss=float(np.mean(losses)),
        grad_norm=float(np.mean(grad_norms)),
        grad_norm_max=float(np.max(grad_norms)),
        clip_ratio=float(np.mean(clip_ratios)),
        entropy=float(np.mean(entropies)),
        trained_tokens=tokens,
        lr=lrs[-1],
        is_weight_mean=weight_mean,
        is_weight_max=weight_max,
        is_masked_share=masked_share,
        behaviour_kl=kl,
        update_kl=float(np.mean(update_kls)) if update_kls else 0.0,
        update_kl_full=float(np.max(full_kls)) if full_kls else 0.0,
        update_scale=float(np.min(scales)) if scales else 1.0,
    )


def _update_kl(model, micros: list[_Micro], before: list[torch.Tensor], s, ranks) -> float:
    """KL(π_before ‖ π_now) per completion token of the minibatch, over every rank."""
    total = count = 0.0
    with torch.no_grad():
        for m, b in zip(micros, before, strict=True):
            now = forward_logprobs(model, m.ids, m.targets, s.temperature, s.autocast_bf16)[0]
            total += kl_sum(b, now, m.mask)
            count += float(m.mask.sum())
    total, count = all_sum(ranks, [total, count])
    return total / max(count, 1.0)


def _trust_region(
    model, start: list[torch.Tensor], micros, before, s: UpdateSettings, ranks
) -> tuple[float, float, float]:
    """Measure the optimizer step just taken from the weights `start`; pull it back along
    its direction while its KL exceeds the bound (trust_region.py). Returns the KL left,
    the full step's KL and the fraction of the step kept. Every rank decides alike: the
    KL is summed over ranks before any comparison."""
    full = kl = _update_kl(model, micros, before, s, ranks)
    if full <= s.max_update_kl:
        return kl, full, 1.0
    params = list(model.parameters())
    with torch.no_grad():
        direction = [p.detach() - p0 for p, p0 in zip(params, start, strict=True)]
    scale = 1.0
    for _ in range(MAX_SHRINKS):
        scale = next_scale(scale, kl, s.max_update_kl)
        _place(params, start, direction, scale)
        kl = _update_kl(model, micros, before, s, ranks)
        if kl <= s.max_update_kl:
            return kl, full, scale
    _place(params, start, direction, 0.0)
    return 0.0, full, 0.0


def _place(params, start, direction, scale: float) -> None:
    """Weights = start + scale × direction."""
    with torch.no_grad():
        for p, p0, d in zip(params, start, direction, strict=True):
            p.copy_(p0 + scale * d)


def _behaviour_figures(
    ranks: Ranks, parts: list[BehaviourStats]
) -> tuple[float, float, float, float]:
    """The step's off-policy figures over every micro-batch of every rank: mean weight,
    largest weight, masked share and KL per token."""
    total = all_sum(
        ranks,
        [
            sum(p.tokens for p in parts),
            sum(p.weight_sum for p in parts),
            sum(p.masked for p in parts),
            sum(p.kl_sum for p in parts),
            sum(p.finite for p in parts),
        ],
    )
    tokens, weight_sum, masked, kl_sum, finite = total
    weight_max = all_max(ranks, max((p.weight_max for p in parts), default=0.0))
    return (
        weight_sum / max(tokens, 1.0),
        weight_max,
        masked / max(tokens, 1.0),
        kl_sum / max(finite, 1.0),
    )
