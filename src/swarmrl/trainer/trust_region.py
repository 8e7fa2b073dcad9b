"""A trust region on each optimizer step: shrink an update that moved the policy too far.

Adam moves every weight by about the learning rate whatever the gradient's scale, so
the policy change of one optimizer step is not bounded by the ratio clip (which only
stops the gradient of tokens already past 1 ± ε) nor by gradient clipping. On the
embedded task single steps moved the policy by a KL of 0.12–0.18 per token, against
0.002–0.01 on most steps, and the task reward collapsed right after them
(docs/trainer.md). TRPO bounds the KL of each update and finds the step by a line
search; here the optimizer takes its step, the KL it made on the minibatch's own
completion tokens is measured with one more forward pass, and a step past the bound
is pulled back along its own direction, θ = θ_before + β·(θ_after − θ_before), β
shrinking until the measured KL is within the bound (after `MAX_SHRINKS` tries the
step is undone: β = 0). Adam's moments keep the full step's update: the
search changes where the weights land, not what the optimizer learned of the gradient.

The KL is the k3 estimate (r − 1) − log r with r = π_after / π_before per completion
token (Schulman 2020), averaged over the minibatch's tokens on every rank. For a step
that changes the policy little, KL grows with the square of the step, so each try
shrinks β by √(bound / KL), a little inside it.

Everything here is pure; `update.py` does the forward passes and moves the weights.
"""

from __future__ import annotations

import math

import torch

MAX_SHRINKS = 4  # line-search tries after the full step
SAFETY = 0.9  # first guess aims a little inside the bound: KL is only near-quadratic


def kl_sum(before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor) -> float:
    """Sum over completion tokens of the k3 estimate of KL(π_before ‖ π_after).

    before, after: [B, T] logprobs of the same tokens under the policy before and after
    the step; mask: [B, T] 1 on completion tokens. A token the step made impossible
    (log ratio −inf) makes the sum inf, which no bound admits.
    """
    with torch.no_grad():
        on = mask > 0
        log_r = (after.double() - before.double()).masked_fill(~on, 0.0)
        per_token = torch.expm1(log_r) - log_r
        return float(per_token[on].sum())


def next_scale(scale: float, kl: float, bound: float) -> float:
    """The step fraction β to try after the step at fraction `scale` measured `kl` (> bound)
    per token: the quadratic model's guess, aimed a little inside the bound."""
    if not math.isfinite(kl):
        return scale / 4
    return scale * SAFETY * math.sqrt(bound / max(kl, bound))
