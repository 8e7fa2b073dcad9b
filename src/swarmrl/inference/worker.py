"""The inference worker process: fetch a policy, pick a step, generate, write a rollout file.

Loop:
1. Load the newest checkpoint: downloaded through the SHARDCAST relays listed in
   `shardcast.servers` (verified shard by shard), or read from the run's checkpoint
   folder when none are listed. A worker may lag: it keeps generating with what it
   has while the bound allows. A policy it cannot list or load (a relay restarting, a
   shard that fails its hash) is retried with a doubling delay, and logged each time.
2. Pick the step to generate for: the lowest step s, from the trainer's current step
   up to (held policy step + async_level), whose folder still lacks enough
   non-zero-advantage samples. None fits: wait for a newer checkpoint.
3. Derive the assignment for (worker address, s, submission counter), generate G
   samples per prompt, score, compute group advantages.
4. Hand the file to the finisher (`finisher.py`: a background thread and one child
   process) that builds its TOPLOC proofs and writes
   `rollouts/step_<s>/<address>-<counter>.parquet` atomically, and go back to 1: proofs
   are built while the next file is generated, off the generation's critical path. One
   file at most is in flight; it takes a counter number but does not count toward its
   step's samples until it is written.

The trainer's current step is the newest checkpoint's step: the trainer is always
building checkpoint n+1 from step-n rollouts while checkpoint n is the newest. On one
machine the worker reads that number from the checkpoint folder (the orchestrator's
job in a real swarm); the weights themselves come through the relays.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from swarmrl.assignment import assign
from swarmrl.backoff import backoff_delay
from swarmrl.checkpoints import checkpoint_dir, latest_checkpoint, load_policy
from swarmrl.config import RunConfig
from swarmrl.inference.finisher import FileFinisher
from swarmrl.inference.rollout import RolloutBatch, generate_rollouts
from swarmrl.inference.sampler import SamplingParams
from swarmrl.rollouts import RolloutFileError, RolloutMeta, read_meta
from swarmrl.runfolder import RunFolder
from swarmrl.tasks.registry import build_task

log = logging.getLogger("swarmrl.worker")


class UsableCounter:
    """Usable samples per step: the trainer's own count for the step it is waiting on
    (`trainer_status.json`: it knows about rejected files and stale samples), otherwise
    the non-zero-advantage counts in the files' footers (each read once)."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = RunFolder(run_dir)
        self._seen: dict[Path, int] = {}

    def count(self, step: int) -> int:
        try:
            status = json.loads(self.folder.trainer_status.read_text())
            if status["step"] == step:
                return int(status["usable"])
        except (OSError, ValueError, KeyError):
            pass  # no status yet, or one being replaced: fall back to the footers
        total = 0
        folder = self.folder.rollout_step(step)
        if not folder.is_dir():
            return 0
        for path in folder.glob("*.parquet"):
            if path not in self._seen:
                try:
                    self._seen[path] = read_meta(path).num_nonzero
                except RolloutFileError:
                    self._seen[path] = 0
            total += self._seen[path]
        return total


def next_counter(folder: Path, address: str) -> int:
    return len(list(folder.glob(f"{address}-*.parquet"))) if folder.is_dir() else 0


def choose_step(
    trainer_step: int,
    policy_step: int,
    async_level: int,
    total_steps: int,
    usable: Callable[[int], int],
    needed: int,
) -> int | None:
    """Lowest step in [trainer_step, policy_step + async_level] still short of samples."""
    for step in range(trainer_step, min(policy_step + async_level, total_steps - 1) + 1):
        if usable(step) < needed:
            return step
    return None


class PolicySource:
    """Where a worker gets policy weights: SHARDCAST servers, or the checkpoint folder."""

    def __init__(self, cfg: RunConfig, address: str) -> None:
        self.servers = list(cfg.shardcast.servers)
        self.ckpt_root = cfg.folder.checkpoints
        self.cache = cfg.folder.worker_cache(address)
        self.bytes_by_server: dict[str, int] = {}

    def newest(self) -> int | None:
        if not self.servers:
            return latest_checkpoint(self.ckpt_root)
        from swarmrl.shardcast.client import latest_version

        return latest_version(self.servers)

    def load(self, step: int):
        if not self.servers:
            return load_policy(checkpoint_dir(self.ckpt_root, step))
        from swarmrl.shardcast.client import fetch

        result = fetch(self.servers, step, self.cache)
        for server, n in result.bytes_by_server.items():
            self.bytes_by_server[server] = self.bytes_by_server.get(server, 0) + n
        policy = load_policy(result.path)
        # Older downloads are no longer needed once the newer policy is loaded.
        for old in self.cache.glob("v*"):
            if old != result.path and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        return policy


def run_worker(cfg: RunConfig, address: str) -> int:
    """Run until the trainer is done; returns the number of rollout files written."""
    torch.set_num_threads(cfg.worker.threads)
    run_dir = cfg.run_dir
    ckpt_root = cfg.folder.checkpoints
    task = build_task(cfg.task)
    counter = UsableCounter(run_dir)
    source = PolicySource(cfg, address)
    model = tok = None
    policy_step = -1
    stats_path = cfg.folder.worker_stats(address)
    stats_path.parent.mkdir(parents=True, exist_ok=True)

    def log_file(path: Path, batch: RolloutBatch, meta: RolloutMeta, waited: float) -> None:
        """One stats line per written file (runs in the finisher's thread)."""
        with open(stats_path, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "time": time.time(),
                        "file": str(path),
                        "step": meta.step,
                        "policy_step": batch.columns["policy_step"][0],
                        "bytes_by_server": dict(source.bytes_by_server),
                        "gen_seconds": round(batch.gen_seconds, 4),
                        "gen_tokens": batch.gen_tokens,
                        "proof_seconds": round(batch.proof_seconds, 4),
                        "proof_wait_seconds": round(waited, 4),
                        "nonzero": batch.num_nonzero,
                    }
                )
                + "\n"
            )

    finisher = FileFinisher(log_file)
    # Trouble reaching or loading the newest policy (a relay restarting, a bad shard) is
    # retried with a doubling delay, not on every poll; meanwhile the worker generates
    # with the policy it holds, as far as the async bound lets it (choose_step).
    failures = 0
    retry_at = 0.0

    def trouble(what: str, exc: Exception) -> None:
        nonlocal failures, retry_at
        failures += 1
        delay = backoff_delay(
            failures, cfg.worker.poll_seconds, cfg.supervision.backoff_max_seconds
        )
        retry_at = time.monotonic() + delay
        held = (
            f"generating with policy {policy_step} meanwhile"
            if model is not None
            else "no policy yet"
        )
        log.warning("%s (%s); %s; retry %d in %.1f s", what, exc, held, failures, delay)

    try:
        while True:
            if cfg.folder.trainer_done.exists():
                break
            latest = latest_checkpoint(ckpt_root)
            available = None
            if time.monotonic() >= retry_at:
                try:
                    available = source.newest()
                except (OSError, RuntimeError, ValueError) as exc:
                    trouble("cannot list policies", exc)
                else:
                    if available is None or available <= policy_step:
                        failures = 0  # reachable and nothing newer: the trouble is over
            if available is not None and available > policy_step:
                try:
                    model, tok = source.load(available)
                    policy_step = available
                    failures = 0
                    log.info("loaded policy step %d", available)
                except (OSError, RuntimeError, ValueError) as exc:
                    trouble(f"could not load policy {available}", exc)
            if latest is None or model is None or tok is None:
                time.sleep(cfg.worker.poll_seconds)
                continue
            pending = finisher.in_flight()
            # A step counts as served by what the trainer can see (written files), not by
            # the file still in flight: until the trainer has its batch, a worker keeps
            # sampling for the oldest step it still lacks, with the freshest policy.
            # Counting the file in flight made workers run ahead to n + async_level on
            # every step (staleness 2 throughout), and the default run then learned far
            # less (held-out accuracy 0.74 instead of 0.98).
            step = choose_step(
                latest,
                policy_step,
                cfg.async_level,
                cfg.trainer.steps,
                counter.count,
                cfg.trainer.batch_samples,
            )
            if step is None:
                time.sleep(cfg.worker.poll_seconds)
                continue
            folder = cfg.folder.rollout_step(step)
            submission = next_counter(folder, address)
            if pending is not None and pending.step == step:
                submission = max(submission, pending.submission + 1)
            assignment = assign(
                cfg.seed,
                address,
                step,
                submission,
                num_problems=task.num_train(),
                prompts=cfg.worker.prompts_per_file,
                group_size=cfg.sampling.group_size,
                target_lengths=cfg.task.target_lengths,
            )
            params = SamplingParams(
                temperature=cfg.sampling.temperature,
                max_new_tokens=cfg.sampling.max_new_tokens,
                eos_token_id=tok.eos_token_id,
                top_p=cfg.sampling.top_p,
            )
            batch = generate_rollouts(
                model,
                tok,
                task,
                assignment,
                params,
                policy_step,
                cfg.task.length_alpha,
                proofs=False,
            )
            meta = RolloutMeta(
                run_id=cfg.run_name,
                worker_address=address,
                step=step,
                submission=submission,
                num_samples=len(batch.columns["problem_id"]),
                num_nonzero=batch.num_nonzero,
            )
            finisher.submit(folder / f"{address}-{submission:05d}.parquet", batch, meta)
    finally:
        finisher.close()
    return finisher.written
