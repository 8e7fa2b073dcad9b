"""Token-level GRPO loss with two-sided clipping (INTELLECT-2, arXiv 2505.07291 §3).

Per completion token, with ratio r = exp(logp - logp_old) and advantage A:

    loss_t = -min( min(r, delta) * A,  clip(r, 1 - eps, 1 + eps) * A )

The ordinary PPO clip bounds r only where clipping helps (A > 0: r <= 1+eps;
A < 0: r >= 1-eps); for A < 0 a large r is otherwise unbounded, which produced loss
and gradient-norm spikes in INTELLECT-2. The delta cap bounds it.

Normalization is by a constant token budget (Dr. GRPO), not per-sequence length: the
sum of per-token losses over the batch is divided by `token_budget`, so long and short
completions weigh each of their tokens equally and the loss scale does not depend on
the lengths the policy happens to produce. Prompt and padding tokens are masked out.
No KL term; an optional entropy bonus.

`token_weights` multiplies each token's loss by its off-policy correction weight
(offpolicy.py: the behaviour policy that sampled the token against policy n); without
them every completion token weighs 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GRPOLossInput:
    logprobs: torch.Tensor  # [B, T] current policy logprob of each completion token
    old_logprobs: torch.Tensor  # [B, T] policy at the start of the rollout step
    advantages: torch.Tensor  # [B] one per sample, broadcast to its tokens
    mask: torch.Tensor  # [B, T] 1 for completion tokens, 0 for prompt and padding
    token_budget: float  # constant normalizer: samples in the batch x max completion length
    entropy: torch.Tensor | None = None  # [B, T] per-token entropy, for the optional bonus
    token_weights: torch.Tensor | None = None  # [B, T] off-policy weights, 0 = masked


@dataclass(frozen=True)
class GRPOLossOutput:
    loss: torch.Tensor
    clip_ratio: torch.Tensor  # share of completion tokens whose ratio was clipped or capped
    mean_ratio: torch.Tensor
    mean_entropy: torch.Tensor


def grpo_loss(
    inp: GRPOLossInput, epsilon: float = 0.2, delta: float = 4.0, entropy_coef: float = 0.0
) -> GRPOLossOutput:
    """The loss of one (mini)batch; see the module docstring for the formula."""
    mask = inp.mask.to(inp.logprobs.dtype)
    adv = inp.advantages.to(inp.logprobs.dtype).unsqueeze(-1)
    ratio = torch.exp(inp.logprobs - inp.old_logprobs)
    capped = torch.clamp(ratio, max=delta) * adv
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * adv
    per_token = -torch.minimum(capped, clipped)
    weighted = mask if inp.token_weights is None else mask * inp.token_weights.detach()
    loss = (per_token * weighted).sum() / inp.token_budget
    n_tokens = mask.sum().clamp(min=1)
    mean_entropy = torch.zeros((), dtype=loss.dtype)
    if inp.entropy is not None:
        mean_entropy = (inp.entropy * mask).sum() / n_tokens
        if entropy_coef:
            # Only on the tokens the loss keeps: a masked token (a forged claim, a ratio
            # out of band) gets no gradient of any kind.
            kept = (weighted > 0).to(mask.dtype)
            loss = loss - entropy_coef * (inp.entropy * kept).sum() / inp.token_budget
    with torch.no_grad():
        # A token's gradient is cut when the min picks a clamped term that is flat in r.
        was_clipped = (
            ((adv > 0) & (ratio > 1 + epsilon))
            | ((adv < 0) & (ratio < 1 - epsilon))
            | ((adv < 0) & (ratio > delta))
        )
        clip_ratio = (was_clipped.to(mask.dtype) * mask).sum() / n_tokens
        mean_ratio = (ratio * mask).sum() / n_tokens
    return GRPOLossOutput(
        loss=loss, clip_ratio=clip_ratio, mean_ratio=mean_ratio, mean_entropy=mean_entropy.detach()
    )


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob and entropy of `tokens` under logits/temperature (as the sampler drew them).

    logits: [B, T, V] predicting tokens [B, T]. Returns ([B, T], [B, T]).
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy
