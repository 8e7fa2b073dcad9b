"""Was a completion sampled honestly from the claimed policy? Replay plus two statistical tests.

1. **Replay** (exact). The sampler draws token t of a sample by inverse CDF with the
   counter-based uniform u_t = ``uniforms(seed, t)`` (``swarmrl.generation.sampler``). The
   validator knows the seed and recomputes the CDF, so an honest token lies in the CDF
   interval [low_t, high_t] that contains u_t, up to numerical drift between the worker's
   decode and the validator's prefill. A token further than ``tolerance`` outside its
   interval is a replay miss, and a token less likely than a floor gets no slack at all.
   With the tolerance above the drift (measured in docs/validator.md) an honest worker
   never misses; text from any other source misses on nearly every token whose
   distribution is not almost deterministic.
2. **Surprisal test** (file level). Under honest sampling the capped surprisal
   s_t = min(-log q(x_t), C) of each token has conditional mean m_t and variance V_t, both
   computed exactly from q_t (``prefill.SURPRISAL_CAP`` = C); S = sum(s_t - m_t) is a
   martingale whose steps lie in [-C, C]. Text from a weaker model has S >> 0 (tokens less
   likely than the policy's own), greedy or colder sampling S << 0. The p-value is
   Freedman's inequality, P(|S| >= t, sum V_t <= w) <= 2 exp(-t^2 / (2 (w + C t / 3))), over
   a grid of w (a union bound, so the observed sum V_t can pick its level): a bound that
   holds for any honest file, however heavy the tail of the raw surprisal. The normal
   approximation it replaces rejected an honest file (one rare token drawn honestly made
   z = 6.07; docs/validator.md). Z = S / sqrt(sum V_t) is still reported.
3. **Probability-integral transform** (file level). With tokens ordered from most to
   least likely, v_t = mass(tokens likelier than x_t) + w_t * q(x_t), where w_t is a
   validator-side uniform, is exactly U(0, 1) under honest sampling. A Kolmogorov-Smirnov
   test of the v_t catches distortions the mean of the surprisal misses.

Each statistical test rejects an honest file with probability at most ``alpha`` (the
surprisal test by a bound, the PIT test asymptotically), so the false-reject rate of the
pair is at most 2·alpha per file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from swarmrl.assignment import stable_hash
from swarmrl.generation.sampler import uniforms
from swarmrl.validator.prefill import SURPRISAL_CAP, TokenStats

# The levels of sum V_t the surprisal test's union bound runs over: w_k = GRID_RATIO^k for
# k < GRID_LEVELS (1 to 8.6e9; a 64 MiB upload holds at most ~1.7e7 tokens, whose V_t are
# each <= C^2 / 4 = 25). A finer grid costs less variance slack (at most GRID_RATIO) and
# more union (the p-value is multiplied by GRID_LEVELS).
GRID_RATIO = 1.1
GRID_LEVELS = 241


def sample_uniforms(seed: int, n_tokens: int) -> np.ndarray:
    """The uniforms the sampler used for tokens 0..n-1 of the sample with this seed."""
    # A stored int64 seed and the sampler's uint64 view of it are the same 64 bits.
    seeds = np.full(n_tokens, seed % (1 << 64), dtype=np.uint64)
    return uniforms(seeds, np.arange(n_tokens, dtype=np.uint64))


@dataclass(frozen=True)
class ReplayResult:
    """Tokens whose seed uniform falls outside their recomputed CDF interval."""

    misses: int
    first_miss: int | None  # token index
    worst_excess: float  # largest distance of a uniform outside its interval (<= 0: all inside)


def replay(
    stats: TokenStats,
    seed: int,
    tolerance: float,
    floor: float = 0.0,
    floor_tolerance: float = 0.0,
) -> ReplayResult:
    """Check each token against the inverse-CDF draw its seed implies (see module docstring).

    A token of probability below ``floor`` gets the smaller slack ``floor_tolerance``:
    otherwise a worker could swap in an unlikely token (a digit, an early EOS) whenever
    the seed's uniform falls within ``tolerance`` of that token's interval. Its slack is
    not zero, because a tiny interval can drift by more than its own width: an honest
    draw of such a token would then always miss (docs/validator.md measures how often).
    """
    u = sample_uniforms(seed, len(stats.cdf_low))
    excess = np.maximum(stats.cdf_low - u, u - stats.cdf_high)
    slack = np.where(stats.prob >= floor, tolerance, floor_tolerance)
    missed = np.flatnonzero(excess > slack)
    return ReplayResult(
        int(missed.size), int(missed[0]) if missed.size else None, float(excess.max())
    )


def _validator_uniforms(seed: int, n_tokens: int) -> np.ndarray:
    """Uniforms independent of the sampler's, for randomizing the discrete PIT."""
    return sample_uniforms(stable_hash(f"swarmrl-pit|{seed}"), n_tokens)


def pit_values(stats: TokenStats, seed: int) -> np.ndarray:
    """Randomized probability-integral transform of each token (U(0, 1) when honest)."""
    return np.clip(
        stats.rank_low + _validator_uniforms(seed, len(stats.prob)) * stats.prob, 0.0, 1.0
    )


def martingale_tail_p(total: float, variation: float, step_bound: float) -> float:
    """Two-sided p-value of a martingale sum ``total`` whose steps are bounded by
    ``step_bound`` and whose conditional variances sum to ``variation``: Freedman's
    inequality at the smallest grid level w >= variation, times the number of levels."""
    t = abs(total)
    level = math.ceil(math.log(variation) / math.log(GRID_RATIO)) if variation > 1.0 else 0
    w = GRID_RATIO**level if level < GRID_LEVELS else variation
    exponent = t * t / (2.0 * (w + step_bound * t / 3.0))
    return min(1.0, 2.0 * GRID_LEVELS * math.exp(-exponent))


def kolmogorov_p(values: np.ndarray) -> tuple[float, float]:
    """(D, p): one-sample KS statistic against U(0, 1) and its asymptotic p-value."""
    n = len(values)
    if n == 0:
        return 0.0, 1.0
    v = np.sort(values)
    i = np.arange(1, n + 1)
    d = float(max((i / n - v).max(), (v - (i - 1) / n).max()))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d  # Stephens' small-sample correction
    if lam < 0.2:
        return d, 1.0
    p = 2.0 * sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam) for k in range(1, 101))
    return d, float(min(1.0, max(0.0, p)))


@dataclass(frozen=True)
class SamplingStatistics:
    """File-level statistical tests of honest sampling."""

    tokens: int
    surprisal_z: float
    surprisal_p: float
    pit_ks: float
    pit_p: float
    worst_sample: int  # the sample with the most extreme per-sample surprisal z
    worst_sample_z: float


def _z(deviation: float, variation: float) -> float:
    return deviation / math.sqrt(max(variation, 1e-12))


def sampling_statistics(all_stats: list[TokenStats], seeds: list[int]) -> SamplingStatistics:
    """Surprisal test and PIT Kolmogorov-Smirnov test over every token of a file."""
    dev = np.concatenate([s.surprisal - s.surprisal_mean for s in all_stats])
    var = float(np.concatenate([s.surprisal_var for s in all_stats]).sum())
    per_sample = [
        _z(float((s.surprisal - s.surprisal_mean).sum()), float(s.surprisal_var.sum()))
        for s in all_stats
    ]
    worst = int(np.argmax(np.abs(per_sample)))
    d, p_ks = kolmogorov_p(
        np.concatenate([pit_values(s, seed) for s, seed in zip(all_stats, seeds, strict=True)])
    )
    return SamplingStatistics(
        tokens=len(dev),
        surprisal_z=_z(float(dev.sum()), var),
        surprisal_p=martingale_tail_p(float(dev.sum()), var, SURPRISAL_CAP),
        pit_ks=d,
        pit_p=p_ks,
        worst_sample=worst,
        worst_sample_z=per_sample[worst],
    )
