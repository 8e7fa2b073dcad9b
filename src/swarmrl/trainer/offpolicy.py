"""Off-policy correction: weights for tokens sampled by an older policy than the trainer's.

In an asynchronous run the samples of step n were drawn by a worker's policy μ (a
checkpoint n − k, k ≤ async_level), while the GRPO loss's clipped ratio
r = π_θ / π_n is taken against policy n, recomputed on the trainer at the start of the
step. Nothing in r corrects for μ ≠ π_n. Following decoupled PPO (Hilton et al. 2021;
AReaL), each token's loss is multiplied by a weight built from the behaviour ratio

    ρ_t = π_n(y_t) / μ(y_t) = exp(logp_n − logp_μ),

where logp_μ is the worker's recorded sampling logprob (`output_logprobs`). Modes:

- ``tis``: truncated importance sampling, w_t = min(ρ_t, cap) (Ionides 2008; the TIS of
  Yao et al. 2025 for training–inference mismatch);
- ``icepop``: w_t = ρ_t inside the band [low, high], 0 outside (IcePop, Ring-1T 2025):
  tokens the two policies disagree on strongly are dropped, not down-weighted;
- ``seq_mask``: the sequence's geometric-mean ratio exp(mean_t log ρ_t) must lie in
  the band, else every token of the sequence is masked; kept tokens have weight 1
  (verl's geometric-mean rejection);
- ``none``: w_t = 1 (the loss as before).

On top of any mode, ``behaviour_clip`` c > 0 masks a token whose ratio has already moved
past the band in its advantage's direction: A > 0 and ρ_t > 1 + c, or A < 0 and
ρ_t < 1 − c. That is PPO's own clip taken against μ (the policy that drew the sample)
rather than π_n: once the steps since the sampling have raised a rewarded token's
probability (or lowered a penalised one's) by c, this step does not push it further on
the strength of the same, older sample. A synchronous step (ρ ≈ 1) is unchanged.

Trust: a worker's logprob is a claim, and only a fraction of files is validated, so
every weight is bounded whatever the claim: ≤ cap (tis), ≤ high (icepop), ≤ 1
(seq_mask), and a non-finite ρ (a NaN or infinite claimed logprob) masks its token. A
forged logprob can at most scale its own token's gradient by that bound, or silence it.

Everything here is pure and works on [B, T] tensors with a 0/1 completion mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarmrl.config.sections import OffPolicyMode, TrainerConfig

_RUN = TrainerConfig()  # the defaults are the run config's, stated there once


@dataclass(frozen=True)
class OffPolicySettings:
    """Which correction, and its bounds; by default the run config's (`trainer.off_policy`,
    `tis_cap`, `icepop_band`, `seq_mask_band`)."""

    mode: OffPolicyMode = _RUN.off_policy
    tis_cap: float = _RUN.tis_cap
    band: tuple[float, float] = _RUN.icepop_band  # icepop's token band, ρ in [low, high] kept
    seq_band: tuple[float, float] = _RUN.seq_mask_band  # seq_mask's band on the geometric mean
    behaviour_clip: float = _RUN.behaviour_clip  # c: mask tokens moved past 1 ± c with A; 0 = off

    @classmethod
    def of(cls, trainer: TrainerConfig) -> OffPolicySettings:
        """The settings a run's trainer section asks for."""
        return cls(
            mode=trainer.off_policy,
            tis_cap=trainer.tis_cap,
            band=trainer.icepop_band,
            seq_band=trainer.seq_mask_band,
            behaviour_clip=trainer.behaviour_clip,
        )


@dataclass(frozen=True)
class BehaviourWeights:
    weights: torch.Tensor  # [B, T] per-token weight, 0 where masked (and off the mask)
    kept: torch.Tensor  # [B, T] 1 where a completion token survives the correction
    ratio: torch.Tensor  # [B, T] raw ρ, 1 where not finite or off the mask


@dataclass(frozen=True)
class BehaviourStats:
    """Sums over completion tokens, so micro-batches and ranks add up exactly."""

    tokens: float
    weight_sum: float  # of the weights of all completion tokens (masked ones count 0)
    weight_max: float
    masked: float  # completion tokens the correction masked
    kl_sum: float  # k3 estimate of KL(μ ‖ π_n) summed over tokens with a finite ρ
    finite: float  # completion tokens with a finite ρ


def behaviour_weights(
    current_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    settings: OffPolicySettings,
    advantages: torch.Tensor | None = None,
) -> BehaviourWeights:
    """Per-token weights of the correction `settings.mode` (see the module docstring).

    current_logprobs: logp under π_n; behaviour_logprobs: the sampler's claimed logp;
    both [B, T], already at the sampling temperature; advantages: [B], needed when
    `settings.behaviour_clip` is on. Nothing here takes gradients.
    """
    with torch.no_grad():
        on = mask > 0
        log_ratio = current_logprobs.double() - behaviour_logprobs.double()
        finite = torch.isfinite(log_ratio) & on
        log_ratio = torch.where(finite, log_ratio, torch.zeros_like(log_ratio))
        ratio = torch.exp(log_ratio)  # may overflow to inf for a forged claim
        usable = finite & torch.isfinite(ratio)
        ratio = torch.where(usable, ratio, torch.ones_like(ratio))
        if settings.mode == "none":
            kept = on
            weights = torch.ones_like(ratio)
        elif settings.mode == "tis":
            kept = usable
            weights = torch.clamp(ratio, max=settings.tis_cap)
        elif settings.mode == "icepop":
            low, high = settings.band
            kept = usable & (ratio >= low) & (ratio <= high)
            weights = ratio
        elif settings.mode == "seq_mask":
            low, high = settings.seq_band
            counts = on.sum(-1).clamp(min=1)
            # A sequence with any non-finite claim has no trustworthy mean: masked whole.
            mean_log = (log_ratio * on).sum(-1) / counts
            ok = (usable == on).all(-1)
            inside = ok & (mean_log >= torch.log(torch.tensor(low, dtype=mean_log.dtype)))
            inside &= mean_log <= torch.log(torch.tensor(high, dtype=mean_log.dtype))
            kept = on & inside.unsqueeze(-1)
            weights = torch.ones_like(ratio)
        else:
            raise ValueError(f"unknown off-policy correction {settings.mode!r}")
        if settings.behaviour_clip > 0:
            if advantages is None:
                raise ValueError("behaviour_clip needs the samples' advantages")
            c = settings.behaviour_clip
            adv = advantages.double().unsqueeze(-1)
            moved = ((adv > 0) & (ratio > 1 + c)) | ((adv < 0) & (ratio < 1 - c))
            kept = kept & ~moved
        weights = torch.where(kept, weights, torch.zeros_like(weights))
        return BehaviourWeights(
            weights=weights.to(current_logprobs.dtype),
            kept=kept.to(current_logprobs.dtype),
            ratio=torch.where(on, ratio, torch.ones_like(ratio)).to(current_logprobs.dtype),
        )


def behaviour_stats(
    bw: BehaviourWeights,
    current_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
) -> BehaviourStats:
    """Token sums for the step's log: weights, masked share and the k3 estimate
    (ρ − 1) − log ρ of KL(μ ‖ π_n) (Schulman 2020), unbiased with samples from μ."""
    with torch.no_grad():
        on = mask > 0
        log_ratio = current_logprobs.double() - behaviour_logprobs.double()
        finite = torch.isfinite(log_ratio) & on & torch.isfinite(torch.exp(log_ratio))
        lr = torch.where(finite, log_ratio, torch.zeros_like(log_ratio))
        k3 = torch.expm1(lr) - lr
        return BehaviourStats(
            tokens=float(on.sum()),
            weight_sum=float((bw.weights.double() * on).sum()),
            weight_max=float(bw.weights[on].max()) if bool(on.any()) else 0.0,
            masked=float((on & (bw.kept <= 0)).sum()),
            kl_sum=float((k3 * finite).sum()),
            finite=float(finite.sum()),
        )
