"""Unit tests of the validator's pure parts: selection, statistics, replay, value checks, CLI exit codes."""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pytest
import torch

from helpers import random_model
from pool_fixtures import make_pool
from swarmrl.generation.fast_llama import length_batches
from swarmrl.rewards import group_advantages
from swarmrl.rollouts import Rollouts
from swarmrl.runfolder import RunFolder
from swarmrl.validator import checks, cli, selected_for_validation
from swarmrl.validator.prefill import SURPRISAL_CAP, TokenStats
from swarmrl.validator.sampling import (
    GRID_LEVELS,
    kolmogorov_p,
    martingale_tail_p,
    replay,
    sample_uniforms,
    sampling_statistics,
)


def test_selection_is_deterministic_secret_dependent_and_hits_the_fraction():
    hashes = [f"{i:064x}" for i in range(4000)]
    picked = [selected_for_validation(h, b"secret", 0.25) for h in hashes]
    assert picked == [selected_for_validation(h, b"secret", 0.25) for h in hashes]
    assert 0.22 < np.mean(picked) < 0.28
    other = [selected_for_validation(h, b"other secret", 0.25) for h in hashes]
    assert picked != other  # a worker without the secret cannot predict the choice
    assert all(selected_for_validation(h, b"s", 1.0) for h in hashes[:50])
    assert not any(selected_for_validation(h, b"s", 0.0) for h in hashes[:50])


def test_kolmogorov_p_accepts_uniform_and_rejects_skewed_values():
    rng = np.random.default_rng(0)
    assert kolmogorov_p(rng.random(5000))[1] > 1e-3
    assert kolmogorov_p(rng.random(5000) ** 1.3)[1] < 1e-6


def _stats(low: list[float], high: list[float]) -> TokenStats:
    n = len(low)
    z = np.zeros(n)
    return TokenStats(
        hidden=torch.zeros(n, 4, dtype=torch.bfloat16),
        logprobs=z,
        eos_probs=z,
        cdf_low=np.array(low),
        cdf_high=np.array(high),
        surprisal=z,
        surprisal_mean=z,
        surprisal_var=z,
        rank_low=z,
        prob=z,
    )


def test_replay_accepts_the_interval_holding_the_seed_uniform_and_nothing_else():
    u = sample_uniforms(12345, 3)
    inside = _stats(list(u - 0.01), list(u + 0.01))
    assert replay(inside, 12345, 1e-3).misses == 0
    shifted = _stats(
        [u[0] - 0.01, u[1] + 0.05, u[2] - 0.01], [u[0] + 0.01, u[1] + 0.1, u[2] + 0.01]
    )
    result = replay(shifted, 12345, 1e-3)
    assert (result.misses, result.first_miss) == (1, 1)
    assert replay(shifted, 12345, 0.06).misses == 0  # within the drift tolerance


def _interval(u: float, low: float, high: float, prob: float) -> TokenStats:
    stats = _stats([low], [high])
    stats.prob = np.array([prob])
    return stats


def test_replay_rejects_a_likely_token_just_outside_and_passes_a_drifted_tiny_interval():
    """The issue's swap: a token of probability 0.58 whose interval ends 1.1e-5 short of the
    seed's uniform passed the previous default (1e-4) and misses under the tolerance set
    from the measured drift. A token of probability 1e-7 whose interval drifted 5e-7 past
    the uniform (more than its own width: an honest draw, docs/validator.md) missed under
    the previous zero slack below the floor and now passes."""
    from swarmrl.validator.settings import ValidatorSettings

    u = float(sample_uniforms(99, 1)[0])
    now = ValidatorSettings()
    rules = (now.replay_tolerance, now.replay_floor, now.replay_floor_tolerance)
    before = (1e-4, 1e-4, 0.0)
    swapped = _interval(u, u - 1.1e-5 - 0.58, u - 1.1e-5, 0.58)
    assert replay(swapped, 99, *before).misses == 0
    assert replay(swapped, 99, *rules).misses == 1
    drifted = _interval(u, u + 5e-7, u + 6e-7, 1e-7)
    assert replay(drifted, 99, *before).misses == 1
    assert replay(drifted, 99, *rules).misses == 0


def _rows(
    rewards: list[float], task_rewards: list[float], targets: list[int], lengths: list[int]
) -> Rollouts:
    n = len(rewards)
    return Rollouts(
        problem_id=["p"] * n,
        input_tokens=[[5]] * n,
        output_tokens=[[7] * k for k in lengths],
        output_logprobs=[[0.0] * k for k in lengths],
        rewards=rewards,
        task_rewards=task_rewards,
        length_penalties=[0.02 * abs(t - k) for t, k in zip(targets, lengths, strict=True)],
        advantages=group_advantages(rewards).tolist(),
        target_lengths=targets,
        policy_step=[0] * n,
        seed=list(range(n)),
        proofs=[b""] * n,
    )


def test_values_check_recomputes_penalties_rewards_and_advantages():
    lengths, targets, task = [30, 40, 32, 44], [32, 32, 32, 44], [1.0, 0.0, 1.0, 0.0]
    honest_rewards = [t - 0.02 * abs(g - k) for t, g, k in zip(task, targets, lengths, strict=True)]
    assert checks.check_values(
        _rows(honest_rewards, task, targets, lengths),
        task,
        alpha=0.02,
        group_size=4,
        tolerance=1e-5,
        shaping="subtract",
    ).passed
    inflated = _rows([honest_rewards[0] + 0.3, *honest_rewards[1:]], task, targets, lengths)
    result = checks.check_values(
        inflated, task, alpha=0.02, group_size=4, tolerance=1e-5, shaping="subtract"
    )
    assert (
        not result.passed
        and result.failures[0].sample == 0
        and "reward" in result.failures[0].detail
    )
    # A worker claiming a task reward the verifier does not give:
    lying = _rows(honest_rewards, [1.0, 1.0, 1.0, 0.0], targets, lengths)
    assert (
        checks.check_values(
            lying, task, alpha=0.02, group_size=4, tolerance=1e-5, shaping="subtract"
        )
        .failures[0]
        .sample
        == 1
    )
    nan = _rows(honest_rewards, task, targets, lengths)
    nan.advantages[2] = float("nan")
    assert (
        checks.check_values(nan, task, alpha=0.02, group_size=4, tolerance=1e-5, shaping="subtract")
        .failures[0]
        .sample
        == 2
    )


def test_values_check_with_scaled_length_shaping():
    lengths, targets, task = [30, 40, 32, 44], [32, 32, 32, 44], [1.0, 0.0, 1.0, 0.0]
    scaled = [t * np.exp(-0.2 * abs(g - k)) for t, g, k in zip(task, targets, lengths, strict=True)]
    rows = _rows(scaled, task, targets, lengths)
    rows = rows.replace(length_penalties=[t - r for t, r in zip(task, scaled, strict=True)])
    check = lambda shaping: checks.check_values(  # noqa: E731
        rows, task, alpha=0.2, group_size=4, tolerance=1e-5, shaping=shaping
    )
    assert check("scale").passed
    assert not check("subtract").passed


def test_consistency_check_bounds_policy_step_and_groups():
    rows = _rows([0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [32] * 4, [3] * 4)
    rows = Rollouts(**{**rows.__dict__, "policy_step": [4] * 4})
    ok = {
        "step": 5,
        "async_level": 2,
        "group_size": 4,
        "prompts": 1,
        "run_id": "r",
        "expected_run_id": "r",
        "num_nonzero": 4,
    }
    assert checks.check_consistency(rows, **ok).passed
    stale = Rollouts(**{**rows.__dict__, "policy_step": [2] * 4})
    assert "outside [3, 5]" in checks.check_consistency(stale, **ok).failures[0].detail
    assert not checks.check_consistency(rows, **{**ok, "num_nonzero": 0}).passed


def test_prefill_batches_respect_the_token_budget():
    lengths = [5, 50, 7, 49, 20, 3]
    batches = length_batches(lengths, token_budget=100)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert all(max(lengths[i] for i in b) * len(b) <= 100 for b in batches)


def _run_cli(argv, capsys):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr()


def test_cli_gives_exit_2_and_one_line_for_a_file_that_is_not_parquet(tmp_path, capsys):
    bad = tmp_path / "rollouts" / "step_000000" / "w-00000.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"PAR1 this is not a parquet file")
    code, out = _run_cli(["validate", str(bad)], capsys)
    assert (
        code == 2
        and out.out == ""
        and out.err.count("\n") == 1
        and "unusable: unreadable rollout file" in out.err
    )
    code, out = _run_cli(["validate", str(bad), "--json"], capsys)
    assert code == 2 and '"status": "unusable"' in out.out


def test_cli_skips_files_not_selected(tmp_path, capsys):
    path = tmp_path / "f.parquet"
    path.write_bytes(b"anything")
    secret = tmp_path / "secret"
    secret.write_bytes(b"s")
    code, out = _run_cli(
        ["validate", str(path), "--fraction", "0", "--secret-file", str(secret)], capsys
    )
    assert code == 0 and "skipped" in out.out


def _planted(run_dir, name: str, step: int, policy_step: int):
    """A tiny well-formed rollout file claiming ``policy_step`` for ``step``."""
    from swarmrl.rollouts import RolloutMeta, write_rollouts

    n = 2
    cols = {
        "problem_id": ["p"] * n,
        "input_tokens": [[5, 6]] * n,
        "output_tokens": [[7, 2]] * n,
        "output_logprobs": [[-1.0, -1.0]] * n,
        "rewards": [1.0, 0.0],
        "task_rewards": [1.0, 0.0],
        "length_penalties": [0.0] * n,
        "advantages": [1.0, -1.0],
        "target_lengths": [-1] * n,
        "policy_step": [policy_step] * n,
        "seed": [0, 1],
        "proofs": [b""] * n,
    }
    meta = RolloutMeta(
        run_id="r", worker_address="w", step=step, submission=0, num_samples=n, num_nonzero=n
    )
    return write_rollouts(run_dir / "rollouts" / f"step_{step:06d}" / name, cols, meta)


def test_validator_service_verdicts_without_a_model(tmp_path):
    """A file whose checkpoint no server lists is skipped, one claiming a policy newer than
    its step is rejected, an unreadable one is unusable; verdict lines are counted."""
    import json

    from swarmrl.config import load_config
    from swarmrl.rollouts import SeenFiles
    from swarmrl.validator import ValidatorSettings, judge_file
    from swarmrl.validator.service import _Policies, verdict_counts

    run_dir = tmp_path / "run"
    cfg = load_config(None, {"run_name": "r"})
    policies = _Policies(tmp_path / "cache")  # no relay, no origin: nothing can be fetched
    settings = ValidatorSettings()
    gone = judge_file(
        _planted(run_dir, "a.parquet", 5, 3), cfg, policies.get, settings, SeenFiles()
    )
    future = judge_file(
        _planted(run_dir, "b.parquet", 5, 7), cfg, policies.get, settings, SeenFiles()
    )
    garbage = run_dir / "rollouts" / "step_000005" / "c.parquet"
    garbage.write_bytes(b"not parquet")
    unreadable = judge_file(garbage, cfg, policies.get, settings, SeenFiles())
    assert gone.status == "skipped" and "checkpoint 3 cannot be fetched" in gone.reason
    assert future.status == "rejected" and "policy step 7 outside [3, 5]" in future.reason
    assert future.failed_checks == ["consistency"]
    assert unreadable.status == "unusable"
    RunFolder(run_dir).validator.mkdir(parents=True, exist_ok=True)
    with open(RunFolder(run_dir).verdicts, "w") as fh:
        fh.writelines(
            json.dumps({"file": "x", "status": v.status}) + "\n" for v in (gone, future, unreadable)
        )
        fh.write('{"file": "cut sh')  # a line cut short by a kill
    assert verdict_counts(run_dir) == {"accepted": 0, "rejected": 1, "unusable": 1, "skipped": 1}


def test_validator_fetches_claimed_checkpoints_through_shardcast(tmp_path):
    """The validator's policies come from the servers the heartbeat names; a version they
    no longer list is a skip, not a crash."""
    from swarmrl.shardcast.origin import Origin
    from swarmrl.shardcast.server import start_server
    from swarmrl.validator.service import _Policies

    model, tok = random_model()
    folder = tmp_path / "ckpt"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    origin = Origin(tmp_path / "origin", keep=1)
    origin.publish(3, folder)
    server = start_server(origin.root)
    try:
        policies = _Policies(tmp_path / "cache", servers=[server.url])
        loaded, _ = policies.get(3)
        assert loaded.config.vocab_size == model.config.vocab_size
        assert policies.get(3)[0] is loaded  # kept loaded
        assert policies.get(2).status == "skipped"
    finally:
        server.stop()


def _capped_moments(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per token distribution q (rows): capped surprisal of each outcome, its mean, its var."""
    s = np.minimum(-np.log(q), SURPRISAL_CAP)
    mean = (q * s).sum(-1)
    return s, mean, (q * s * s).sum(-1) - mean**2


def _file_stats(q: np.ndarray, drawn: np.ndarray) -> TokenStats:
    s, mean, var = _capped_moments(q)
    n = len(drawn)
    z = np.zeros(n)
    return TokenStats(
        hidden=torch.zeros(n, 4, dtype=torch.bfloat16),
        logprobs=z,
        eos_probs=z,
        cdf_low=z,
        cdf_high=z,
        surprisal=s[np.arange(n), drawn],
        surprisal_mean=mean,
        surprisal_var=var,
        rank_low=z,
        prob=q[np.arange(n), drawn],
    )


def test_martingale_tail_p_is_freedman_at_the_grid_level_times_the_levels():
    # variation 50 rounds up to the grid level 1.1^42 = 54.76; t = 200, steps bounded by 10
    w = 1.1**42
    expected = 2 * GRID_LEVELS * math.exp(-(200.0**2) / (2 * (w + 10 * 200 / 3)))
    assert 1e-10 < expected < 1e-9
    assert math.isclose(martingale_tail_p(200.0, 50.0, 10.0), expected, rel_tol=1e-12)
    assert martingale_tail_p(-200.0, 50.0, 10.0) == martingale_tail_p(200.0, 50.0, 10.0)
    assert martingale_tail_p(0.0, 50.0, 10.0) == 1.0
    assert martingale_tail_p(1e4, 0.0, 10.0) < 1e-100  # below one the level is w = 1


def test_one_rare_token_drawn_honestly_does_not_reject_a_file():
    """A near-deterministic file (2,400 tokens) in which one token of probability 1e-8 was
    drawn: its raw surprisal (18.4) made the normal z-test reject such a file (an honest
    embedded-model file measured z = 6.07); capped and bounded by Freedman's inequality it
    stays far from alpha."""
    n = 2400
    q = np.full((n, 40), 1e-8)  # 39 tokens of 1e-8 at every position: 3.9e-7 of rare mass
    q[:, 0] = 1 - 39e-8
    q[::100, 0], q[::100, 1] = 0.95, 0.05 - 38e-8  # 1% of the tokens have a real choice
    rng = np.random.default_rng(1)
    drawn = np.array([rng.choice(40, p=row / row.sum()) for row in q])
    drawn[n - 1] = 5  # the rare draw: over 2,400 tokens about once in 1,000 files
    raw = -np.log(q[np.arange(n), drawn])
    entropy = -(q * np.log(q)).sum(-1)
    raw_var = (q * np.log(q) ** 2).sum(-1) - entropy**2
    assert (raw - entropy).sum() / math.sqrt(raw_var.sum()) > 4.89  # the old test rejected
    stats = sampling_statistics([_file_stats(q, drawn)], [0])
    assert stats.surprisal_p > 1e-3


def test_surprisal_test_rejects_colder_and_weaker_sampling_and_bounds_honest_rejects():
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 2.0, (3000, 30))
    q = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)

    def file(p: np.ndarray) -> TokenStats:
        u = rng.random((len(p), 1))
        drawn = (np.cumsum(p, -1) < u).sum(-1).clip(max=p.shape[1] - 1)
        return _file_stats(q[: len(p)], drawn)

    cold = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum(-1, keepdims=True)
    flat = np.exp(logits / 2.0) / np.exp(logits / 2.0).sum(-1, keepdims=True)
    assert sampling_statistics([file(cold)], [0]).surprisal_p < 1e-6
    assert sampling_statistics([file(flat)], [0]).surprisal_p < 1e-6
    # honest files: the bound holds whatever the tails, so at alpha = 0.05 well under 5%
    honest = [sampling_statistics([file(q[:300])], [0]).surprisal_p for _ in range(200)]
    assert sum(p < 0.05 for p in honest) <= 10


def test_validator_waits_out_the_rate_limit_and_ends_with_the_run(tmp_path, monkeypatch):
    """A validator over its rate limit (429) waits and asks again instead of exiting; it
    returns once the trainer announces the final checkpoint."""
    import threading

    from swarmrl.config import load_config
    from swarmrl.validator import service

    pool = make_pool(tmp_path, rate_per_second=2.0, rate_burst=3, heartbeat_seconds=0.5)
    try:
        cfg = load_config(
            None,
            {
                "run_name": "test",  # the pool's recipe (make_pool)
                "worker.prompts_per_file": 2,
                "sampling.group_size": 2,
                "trainer.batch_samples": 8,
                "output_dir": str(tmp_path / "out"),
                "validator.poll_seconds": 0.01,  # asks far faster than 2 requests a second
                "validator.wait_seconds": 0.0,  # and is never held
            },
        )
        refusals: list[str] = []
        asked = service.PoolClient.next_for_validation

        def counting(client, wait=0.0):
            try:
                return asked(client, wait)
            except service.PoolRefused as exc:
                refusals.append(exc.code)
                raise

        result: list = []
        client = pool.client(pool.keys["validator"])
        thread = threading.Thread(target=lambda: result.append(service.run_validator(cfg, client)))
        # The real request, its refusals counted.
        monkeypatch.setattr(service.PoolClient, "next_for_validation", counting)
        thread.start()
        deadline = time.monotonic() + 30
        while "rate_limited" not in refusals:
            assert time.monotonic() < deadline, "never over the rate limit"
            assert thread.is_alive(), "the validator exited"
            time.sleep(0.05)
        time.sleep(1.5)  # it waits, then asks again
        assert thread.is_alive()
        pool.trainer.announce_checkpoint(0, "ab" * 32, final=True)
        thread.join(timeout=60)
        assert not thread.is_alive() and result == [
            {"accepted": 0, "rejected": 0, "unusable": 0, "skipped": 0}
        ]
    finally:
        pool.stop()


@pytest.mark.parametrize("wait", [0.0, 2.0])
def test_an_idle_validator_paces_its_asking_and_ends_with_the_run(tmp_path, monkeypatch, wait):
    """With nothing to judge, a validator asking for no wait pauses `poll_seconds` between
    asks; one asking for a long poll is held by the orchestrator. Either way it asks a few
    times a second at most, and it returns soon after the final checkpoint (the held
    request is answered then, and it asks for its heartbeat at once)."""
    import threading

    from swarmrl.config import load_config
    from swarmrl.validator import service

    # With a long poll the heartbeat is slow (30 s): the view alone would be late.
    pool = make_pool(tmp_path, heartbeat_seconds=30.0 if wait else 1.0)
    try:
        cfg = load_config(
            None,
            {
                "run_name": "test",
                "worker.prompts_per_file": 2,
                "sampling.group_size": 2,
                "trainer.batch_samples": 8,
                "output_dir": str(tmp_path / "out"),
                "validator.poll_seconds": 0.3,
                "validator.wait_seconds": wait,
            },
        )
        asks: list[float] = []
        asked = service.PoolClient.next_for_validation

        def counting(client, wait=0.0):
            asks.append(time.monotonic())
            return asked(client, wait)

        monkeypatch.setattr(service.PoolClient, "next_for_validation", counting)
        result: list = []
        client = pool.client(pool.keys["validator"])
        thread = threading.Thread(
            target=lambda: result.append(service.run_validator(cfg, client)), daemon=True
        )
        thread.start()
        time.sleep(3.0)
        assert thread.is_alive() and 1 <= len(asks) <= 12  # not spinning
        announced = time.monotonic()
        pool.trainer.announce_checkpoint(0, "ab" * 32, final=True)
        thread.join(timeout=60)
        assert not thread.is_alive() and result[0]["accepted"] == 0
        if wait:
            assert time.monotonic() - announced < 10  # not the 30 s heartbeat
    finally:
        pool.stop()
