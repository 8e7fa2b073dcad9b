"""The validator's checks: pure functions from a rollout file's rows (and recomputed values) to results.

Each check returns a ``CheckResult``: its name, the samples that fail it (first failing
detail per sample) and a few figures. The assignment and values checks, which the
trainer runs too, live in ``swarmrl.scoring`` and are re-exported here. Nothing here
touches disk or runs the model; the verdict module (``verdict.py``) gathers the inputs
and runs the checks in order:

duplicate -> consistency -> assignment -> values -> termination -> toploc -> logprobs -> sampling
"""

from __future__ import annotations

import math

import numpy as np

from swarmrl.rewards import has_signal
from swarmrl.rollouts import Rollouts
from swarmrl.scoring import (
    CheckFailure,
    CheckResult,
    ExpectedPrompt,
    check_assignment,
    check_result,
    check_values,
)
from swarmrl.toploc import ToplocThresholds, verify_proofs_batch
from swarmrl.validator.prefill import TokenStats
from swarmrl.validator.sampling import ReplayResult, SamplingStatistics

__all__ = [
    "CHECK_ORDER",
    "CheckFailure",
    "CheckResult",
    "ExpectedPrompt",
    "check_assignment",
    "check_consistency",
    "check_logprobs",
    "check_sampling",
    "check_termination",
    "check_toploc",
    "check_values",
]

CHECK_ORDER = (
    "duplicate",
    "consistency",
    "assignment",
    "values",
    "termination",
    "toploc",
    "logprobs",
    "sampling",
)


def check_consistency(
    rows: Rollouts,
    *,
    step: int,
    async_level: int,
    group_size: int,
    prompts: int,
    run_id: str,
    expected_run_id: str,
    num_nonzero: int,
) -> CheckResult:
    """Shape of the file: size, one group per prompt, policy step within the async bound.

    Token ids, lengths and finite values were checked by the strict reader's bounds
    (``rollouts.read_rollouts``, ``check_rollout_table``) before any check runs.
    """
    failures = []
    if run_id != expected_run_id:
        failures.append(
            CheckFailure(
                "consistency",
                None,
                f"file is for run {run_id!r}, the config's run is {expected_run_id!r}",
            )
        )
    if len(rows) != prompts * group_size:
        failures.append(
            CheckFailure(
                "consistency",
                None,
                f"{len(rows)} samples; a submission holds {prompts} prompts x {group_size} samples",
            )
        )
    for i in range(len(rows)):
        head = i - i % group_size
        p = rows.policy_step[i]
        if not step - async_level <= p <= step:
            failures.append(
                CheckFailure(
                    "consistency",
                    i,
                    f"policy_step {p} outside [{step - async_level}, {step}] (step {step}, async level {async_level})",
                )
            )
        elif p != rows.policy_step[0]:
            failures.append(
                CheckFailure(
                    "consistency",
                    i,
                    f"policy_step {p} differs from the file's first sample ({rows.policy_step[0]})",
                )
            )
        elif (rows.problem_id[i], rows.input_tokens[i], rows.target_lengths[i]) != (
            rows.problem_id[head],
            rows.input_tokens[head],
            rows.target_lengths[head],
        ):
            failures.append(
                CheckFailure(
                    "consistency",
                    i,
                    f"sample is not in the group of sample {head}: a group is {group_size} consecutive samples of one prompt",
                )
            )
    if len(rows) % group_size == 0:
        counted = sum(
            group_size
            for g in range(0, len(rows), group_size)
            if has_signal(rows.rewards[g : g + group_size])
        )
        if counted != num_nonzero:
            failures.append(
                CheckFailure(
                    "consistency",
                    None,
                    f"metadata says {num_nonzero} non-zero-advantage samples, the rewards give {counted}",
                )
            )
    return check_result("consistency", failures)


def check_termination(
    rows: Rollouts,
    stats: list[TokenStats],
    replays: list[ReplayResult],
    *,
    eos_id: int,
    max_new_tokens: int,
    min_eos_prob: float,
    replay_exempts_eos: bool,
) -> CheckResult:
    """A sample ends with EOS or at the length limit; an EOS is probable (> min_eos_prob), or
    replay-confirmed: the draw the sample's seed forces."""
    failures = []
    low_eos = 0
    for i, out in enumerate(rows.output_tokens):
        early = [t for t, tok in enumerate(out[:-1]) if tok == eos_id]
        if early:
            failures.append(
                CheckFailure("termination", i, f"EOS at token {early[0]} is not the last token")
            )
        elif out[-1] != eos_id and len(out) != max_new_tokens:
            failures.append(
                CheckFailure(
                    "termination",
                    i,
                    f"stops after {len(out)} tokens without EOS, before the limit {max_new_tokens}",
                )
            )
        elif out[-1] == eos_id and not stats[i].eos_probs[-1] > min_eos_prob:
            low_eos += 1
            # The replay gives a token below its floor no slack, so a confirmed EOS of any
            # probability is the exact draw of the seed: not the worker's choice. (Honest
            # workers do draw EOS tokens of probability < 1e-4: refusing them slashed an
            # honest worker in a default run.)
            confirmed = replay_exempts_eos and replays[i].misses == 0
            if not confirmed:
                failures.append(
                    CheckFailure(
                        "termination",
                        i,
                        f"ends on an EOS of probability {stats[i].eos_probs[-1]:.3g} "
                        f"(needs > {min_eos_prob}, or drawn by the seed replay)",
                    )
                )
    return check_result("termination", failures, low_probability_eos=low_eos)


def check_toploc(
    hidden: list, proofs: list[list[bytes]], thresholds: ToplocThresholds
) -> CheckResult:
    """TOPLOC: each sample's proofs against the validator's own bf16 hidden states."""
    failures = []
    worst = [0, 0.0, 0.0]
    for i, chunks in enumerate(verify_proofs_batch(hidden, proofs, thresholds=thresholds)):
        for c in chunks:
            worst = [
                max(worst[0], c.exp_mismatches),
                max(worst[1], c.mant_err_mean),
                max(worst[2], c.mant_err_median),
            ]
        bad = [c for c in chunks if not c.passed]
        if bad:
            c = bad[0]
            failures.append(
                CheckFailure(
                    "toploc",
                    i,
                    f"chunk {c.chunk}: {c.exp_mismatches}/{c.n_points} exponent mismatches, "
                    f"mantissa error mean {c.mant_err_mean:.3g}, median {c.mant_err_median:.3g} "
                    f"(limits {thresholds.max_exp_mismatches}, {thresholds.max_mant_err_mean}, "
                    f"{thresholds.max_mant_err_median})",
                )
            )
    return check_result(
        "toploc",
        failures,
        max_exp_mismatches=worst[0],
        max_mant_err_mean=worst[1],
        max_mant_err_median=worst[2],
    )


def check_logprobs(rows: Rollouts, stats: list[TokenStats], tolerance: float) -> CheckResult:
    """The worker's reported output_logprobs agree with the recomputed ones."""
    failures = []
    worst = 0.0
    for i, (reported, s) in enumerate(zip(rows.output_logprobs, stats, strict=True)):
        diff = np.abs(np.asarray(reported, dtype=np.float64) - s.logprobs)
        diff = np.where(np.isnan(diff), np.inf, diff)
        worst = max(worst, float(diff.max()))
        if diff.max() > tolerance:
            t = int(diff.argmax())
            failures.append(
                CheckFailure(
                    "logprobs",
                    i,
                    f"token {t}: reported logprob {reported[t]:.6g}, recomputed {s.logprobs[t]:.6g} "
                    f"(tolerance {tolerance})",
                )
            )
    return check_result("logprobs", failures, max_abs_diff=worst)


def check_sampling(
    replays: list[ReplayResult],
    statistics: SamplingStatistics,
    *,
    max_replay_misses: int,
    alpha: float,
) -> CheckResult:
    """Replay of every token from its seed, then the file-level surprisal and PIT tests."""
    failures = []
    for i, r in enumerate(replays):
        if r.misses > max_replay_misses:
            failures.append(
                CheckFailure(
                    "sampling",
                    i,
                    f"{r.misses} tokens not drawn by the seed's inverse-CDF replay "
                    f"(first at token {r.first_miss}, off by {r.worst_excess:.3g})",
                )
            )
    if statistics.surprisal_p < alpha:
        failures.append(
            CheckFailure(
                "sampling",
                statistics.worst_sample,
                f"surprisal z = {statistics.surprisal_z:.2f} over {statistics.tokens} tokens "
                f"(Freedman bound p = {statistics.surprisal_p:.2g} < {alpha}); "
                f"this sample's z = {statistics.worst_sample_z:.2f}",
            )
        )
    if statistics.pit_p < alpha:
        failures.append(
            CheckFailure(
                "sampling",
                None,
                f"probability-integral transform KS D = {statistics.pit_ks:.3f} over "
                f"{statistics.tokens} tokens (p = {statistics.pit_p:.2g} < {alpha})",
            )
        )
    worst_excess = max((r.worst_excess for r in replays), default=-math.inf)
    return check_result(
        "sampling",
        failures,
        surprisal_z=statistics.surprisal_z,
        surprisal_p=statistics.surprisal_p,
        pit_ks=statistics.pit_ks,
        pit_p=statistics.pit_p,
        max_replay_excess=worst_excess,
    )
