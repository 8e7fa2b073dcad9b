"""The simulator's parameters, and the two scenarios it answers: the measured small run
(calibration) and a 32B-class swarm. Where each number comes from is said beside it.

Distributions: a worker's speed factor is log-normal across workers (sigma
`speed_sigma`, median 1) and each file's generation time log-normal around it (sigma
`file_sigma`); a worker's downlink is log-normal (median `worker_down_mbit`, sigma
`link_sigma`); joins, graceful leaves and silent deaths are Poisson processes; a group
has signal (non-zero advantage) with probability `group_yield`, independently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MBIT = 1e6 / 8  # bytes per second in one megabit per second


@dataclass(frozen=True)
class SwarmParams:
    name: str
    workers: int
    steps: int  # trained steps to simulate (after `warmup_steps`)
    warmup_steps: int = 2  # steps left out of the figures (first fetch of policy 0)
    max_seconds: float = 48 * 3600.0  # simulated time limit
    seed: int = 0
    # the orchestrator (OrchestratorConfig fields; the Pool applies them)
    batch_samples: int = 128
    prompts_per_assignment: int = 8
    group_size: int = 8
    async_level: int = 2
    max_ahead: int = 1
    surplus: float = 0.1
    heartbeat_seconds: float = 10.0
    unhealthy_after: int = 3
    dead_after: int = 6
    assignment_seconds: float = 600.0
    validation_fraction: float = 0.1
    speculate: bool = False
    sweep_seconds: float = 1.0
    # the trainer
    train_seconds: float = 1.1  # recompute old logprobs + optimizer steps, per step
    save_seconds: float = 0.3  # write the checkpoint and the resume state
    trainer_poll: float = 0.25  # POLL_SECONDS of trainer/trainer.py
    read_seconds_per_file: float = 0.01  # download + rescoring of one file
    max_read_ratio: float = 4.0  # trainer.max_read_ratio
    # workers
    # one assignment at speed 1: fitted (bench_validator: 0.165 s on an idle core)
    file_seconds: float = 0.25
    speed_sigma: float = 0.0
    file_sigma: float = 0.1
    finish_seconds: float = 0.05  # proofs + write, off the generation loop
    load_seconds: float = 0.2  # load a fetched checkpoint
    # False: the loop blocks while it fetches (the worker the calibration measured, before
    # 2026-12-06); True: it fetches beside generation and swaps the policy in at its next
    # request (inference/policy_source.py), the worker today.
    background_fetch: bool = False
    worker_poll: float = 0.2  # worker.poll_seconds
    group_yield: float = 0.6  # share of groups with signal
    file_bytes: float = 48e3
    # checkpoints and links
    checkpoint_bytes: float = 4.27e6
    delta_ratio: float | None = None  # None: full checkpoints only
    delta_encode_bytes_per_s: float = 81e6  # docs/shardcast.md: 268 MB bf16 in 3.3 s
    delta_decode_bytes_per_s: float = 112e6  # docs/shardcast.md: 268 MB bf16 in 2.4 s
    origin_up_mbit: float = 1e4
    relay_up_mbit: float = 1e4
    relay_down_mbit: float = 1e4
    worker_down_mbit: float = 1e4
    worker_up_mbit: float = 1e4
    link_sigma: float = 0.0
    relays: int = 1
    fanout: int = 1
    relay_poll: float = 2.0  # swarmrl relay --poll-s
    transfer_overhead: float = 0.08  # per transfer: fitted, 1.79 s measured − 1.71 s of bytes
    # churn and cheaters
    joins_per_hour: float = 0.0  # share of the pool joining per hour
    leaves_per_hour: float = 0.0  # share leaving gracefully per hour
    deaths_per_hour: float = 0.0  # share dying silently per hour
    cheater_share: float = 0.0
    detect_probability: float = 1.0  # a validated cheating file is rejected
    validators: int = 1
    validator_poll: float = 0.5  # validator.poll_seconds: an idle validator's wait
    validate_seconds: float = 0.15  # one file (docs/validator.md: ~7 files/s idle, 1 thread)
    coalesce_seconds: float = 0.0  # idle polls answered alike (0: every poll is a Pool call)

    def pool_settings(self) -> dict:
        return {
            "batch_samples": self.batch_samples,
            "prompts_per_assignment": self.prompts_per_assignment,
            "group_size": self.group_size,
            "async_level": self.async_level,
            "max_ahead": self.max_ahead,
            "surplus": self.surplus,
            "heartbeat_seconds": self.heartbeat_seconds,
            "unhealthy_after": self.unhealthy_after,
            "dead_after": self.dead_after,
            "assignment_seconds": self.assignment_seconds,
            "validation_fraction": self.validation_fraction,
            "speculate": self.speculate,
            "max_new_tokens": 64,
            "max_prompt_tokens": 64,
        }


def calibration(link_mbit: float | None, seed: int = 0, steps: int = 40, **over) -> SwarmParams:
    """The measured netns run (2026-12-02, 5faff19): two workers, one relay, the
    hand-started pool's defaults then (heartbeat 10 s, dead after 6 beats, assignments
    600 s, relay poll 2 s, no speculative re-issue), the embedded model's 4.27 MB
    checkpoint, 128 usable samples a step from files of 8 prompts × 8. `link_mbit`: what
    flows into the workers' and the relay's namespaces capped (tbf shapes the egress of
    the host's end of each veth: the downloads; two workers fetching at once each took
    the 1.79 s one fetch takes at 20 mbit); None: unconstrained veth."""
    cap = link_mbit if link_mbit is not None else 1e4
    return SwarmParams(
        name=f"netns, {'unconstrained' if link_mbit is None else f'{link_mbit:g} mbit'}",
        workers=2,
        steps=steps,
        seed=seed,
        relay_down_mbit=cap,
        worker_down_mbit=cap,
        **over,
    )


# 32B class. Measured: the delta ratio (docs/shardcast.md, 134 M bf16: 0.20), the delta
# codec's speed (same page, one core), the paper's checkpoint (62 GB) and broadcast rate
# (62 GB in ~14 min through a relay tree, ≈ 590 Mb/s) and recipe (256 prompts × 16,
# async level 2, target lengths 2k..10k). Not measured here (assumptions, each a flag):
# generation speed, training time, relay and origin links.
def swarm_32b(workers: int, seed: int = 0, steps: int = 8, **over) -> SwarmParams:
    base = SwarmParams(
        name=f"32B class, {workers:,} workers",
        workers=workers,
        steps=steps,
        warmup_steps=1,
        seed=seed,
        batch_samples=256 * 16,
        prompts_per_assignment=1,
        group_size=16,
        # docs/deployment.md: raise the heartbeat with many workers; at 10 s, 10,000
        # workers send 1,000 heartbeats and 2,000 idle polls (retry: half a beat) a second
        heartbeat_seconds=30.0,
        unhealthy_after=3,
        dead_after=6,
        assignment_seconds=3600.0,
        speculate=True,
        # 64 H100s at 40% of 989 TFLOP/s on 8 × 32e9 FLOP × 4096 samples × 6.3k tokens
        train_seconds=260.0,
        save_seconds=31.0,  # 62 GB written at 2 GB/s
        read_seconds_per_file=0.05,
        trainer_poll=2.0,  # a 32B step takes minutes: the trainer lists every 2 s
        validator_poll=2.0,
        sweep_seconds=2.0,
        # one prompt's 16 samples decoded together: 6k tokens (the mean target) at 30
        # tokens/s per sequence (a 32B bf16 model is bound by reading 64 GB per decode
        # step: ~3.35 TB/s on an H100 gives ≤ 52 steps/s)
        file_seconds=200.0,
        speed_sigma=0.5,
        file_sigma=0.3,
        finish_seconds=5.0,
        load_seconds=60.0,  # 62 GB from local disk into GPU memory
        worker_poll=1.0,
        group_yield=0.7,
        file_bytes=16 * 6300 * 16.0,  # tokens, logprobs and proofs: ~16 bytes a token
        checkpoint_bytes=62e9,
        origin_up_mbit=10_000.0,
        relay_up_mbit=10_000.0,
        relay_down_mbit=10_000.0,
        worker_down_mbit=590.0,
        worker_up_mbit=100.0,
        link_sigma=0.7,
        relays=8 + 64,
        fanout=8,
        relay_poll=10.0,
        transfer_overhead=1.0,
        joins_per_hour=0.10,
        leaves_per_hour=0.05,
        deaths_per_hour=0.05,
        cheater_share=0.01,
        validators=max(1, workers // 100),
        validate_seconds=30.0,  # prefill of 16 × 6.3k tokens: ~10x faster than decode
        coalesce_seconds=1.0,
    )
    return replace(base, **over)
