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

The old logprobs (policy n at the start of the step) are recomputed the same way, each
rank for its own share. FSDP's gathers are collectives, so every rank runs the same
number of micro-batches: a rank whose share is shorter runs a masked-out one that adds
nothing to the loss or the gradient.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch

from swarmrl.trainer.batches import Sample
from swarmrl.trainer.distributed import Ranks, all_sum, grad_norm_value
from swarmrl.trainer.loss import GRPOLossInput, grpo_loss, token_logprobs


@dataclass(frozen=True)
class UpdateSettings:
    temperature: float
    max_new_tokens: int
    epsilon: float
    delta: float
    entropy_coef: float
    grad_clip: float
    micro_batch_samples: int | None  # None: a rank's whole share in one pass


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


def forward_logprobs(model, ids, targets, temperature):
    # Right padding keeps every real token's causal context free of pads: no mask needed.
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
    return token_logprobs(logits, targets, temperature)


@dataclass(frozen=True)
class _Micro:
    ids: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor


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
) -> dict:
    """Take one optimizer step per minibatch (learning rate `lrs[i]` for the i-th); every
    rank calls it with the same samples and minibatches. Returns the step's statistics,
    global over ranks."""
    s = settings
    plans = [micro_batches(mb, ranks, s.micro_batch_samples) for mb in minibatches]
    micros = [
        [_micro(samples, idx, mb[0], pad_id, ranks.device) for idx in plan]
        for mb, plan in zip(minibatches, plans, strict=True)
    ]
    model.eval()
    with torch.no_grad():
        old = [
            [forward_logprobs(model, m.ids, m.targets, s.temperature)[0] for m in mb_micros]
            for mb_micros in micros
        ]
    model.train()
    grad_norms, clip_ratios, entropies, losses, tokens = [], [], [], [], 0
    for mb, mb_micros, mb_old, lr in zip(minibatches, micros, old, lrs, strict=True):
        budget = token_budget(len(mb), s.max_new_tokens)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss_sum = token_sum = clipped_sum = entropy_sum = 0.0
        for m, old_logprobs in zip(mb_micros, mb_old, strict=True):
            logprobs, entropy = forward_logprobs(model, m.ids, m.targets, s.temperature)
            out = grpo_loss(
                GRPOLossInput(
                    logprobs=logprobs,
                    old_logprobs=old_logprobs,
                    advantages=m.advantages,
                    mask=m.mask,
                    token_budget=budget,
                    entropy=entropy,
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
        opt.step()
        loss_sum, token_sum, clipped_sum, entropy_sum = all_sum(
            ranks, [loss_sum, token_sum, clipped_sum, entropy_sum]
        )
        losses.append(loss_sum)
        clip_ratios.append(clipped_sum / max(token_sum, 1.0))
        entropies.append(entropy_sum / max(token_sum, 1.0))
        tokens += round(token_sum)
    model.eval()
    return {
        "loss": float(np.mean(losses)),
        "grad_norm": float(np.mean(grad_norms)),
        "grad_norm_max": float(np.max(grad_norms)),
        "clip_ratio": float(np.mean(clip_ratios)),
        "entropy": float(np.mean(entropies)),
        "trained_tokens": tokens,
    }
