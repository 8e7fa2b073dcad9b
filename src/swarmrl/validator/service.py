"""The validator process of a run: judge a secret random fraction of the rollout files as
they arrive, and write one verdict per judged file.

- Which files: ``selected_for_validation(file hash, secret, fraction)``. The secret is
  made once per run, 32 random bytes in ``<run>/validator/secret`` (mode 0600). On one
  machine the workers could read it; in a real swarm only the validator holds it.
- Verdicts: one JSON line per judged file in ``<run>/validator/verdicts.jsonl``
  (``file``, ``status``, ``reason``, ``failed_checks``, ``seconds``); a file the
  validator did not pick is not listed. A restarted validator reads the log and judges
  only the files it lacks.
- The claimed checkpoint is loaded once per policy step and kept while files for it
  arrive. A file whose checkpoint the trainer has already pruned (it keeps the last
  ``trainer.keep_checkpoints``) is logged as ``skipped``, not held against the worker.
- It ends once the trainer has finished and every file present has been seen.

The trainer does not wait for verdicts: once the pool exists, a reject slashes the worker
through the orchestrator's ledger (docs/architecture.md §2, planned).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from swarmrl.checkpoints import checkpoint_dir, load_policy
from swarmrl.config import RunConfig
from swarmrl.jsonl import read_jsonl
from swarmrl.rollouts import file_hash
from swarmrl.runfolder import RunFolder
from swarmrl.validator import checks
from swarmrl.validator.verdict import (
    TOPLOC_PRESETS,
    UnusableInput,
    ValidatorSettings,
    Verdict,
    read_rollout_file,
    rejected_or_accepted,
    selected_for_validation,
    validate_rollouts,
)

log = logging.getLogger("swarmrl.validator")


def run_secret(run_dir: Path) -> bytes:
    """The run's validator secret, created (0600) on first use."""
    path = RunFolder(run_dir).validator / "secret"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as fh:
        fh.write(secrets.token_bytes(32))
    return path.read_bytes()


def read_verdicts(run_dir: Path) -> list[dict]:
    """Every verdict line written so far (a line cut short by a kill is skipped)."""
    return read_jsonl(RunFolder(run_dir).verdicts)


def verdict_counts(run_dir: Path) -> dict[str, int]:
    """Judged files by status (accepted, rejected, unusable, skipped)."""
    counts = Counter(v.get("status") for v in read_verdicts(run_dir))
    return {
        status: counts.get(status, 0) for status in ("accepted", "rejected", "unusable", "skipped")
    }


@dataclass
class _Policies:
    """Loaded checkpoints by policy step; only the newest few are kept in memory."""

    ckpt_root: Path
    keep: int = 3

    def __post_init__(self) -> None:
        self.loaded: dict[int, tuple] = {}

    def get(self, step: int):
        if step not in self.loaded:
            self.loaded[step] = load_policy(checkpoint_dir(self.ckpt_root, step))
            for old in sorted(self.loaded)[: -self.keep]:
                del self.loaded[old]
        return self.loaded[step]


def judge(path: Path, cfg: RunConfig, policies: _Policies, settings: ValidatorSettings) -> Verdict:
    """One file's verdict with the run's config and the claimed checkpoint (never raises for bad input)."""
    try:
        table, meta = read_rollout_file(path)
        policy_step = table.column("policy_step")[0].as_py()
        low = max(0, meta.step - cfg.async_level)
        if not low <= policy_step <= meta.step:
            # Decidable without the checkpoint (which may never have existed, or be pruned).
            failure = checks.CheckFailure(
                "consistency",
                None,
                f"policy step {policy_step} outside [{low}, {meta.step}] for step {meta.step}",
            )
            return rejected_or_accepted([checks.CheckResult("consistency", (failure,))], {})
        try:
            model, tokenizer = policies.get(policy_step)
        except Exception:
            # The trainer keeps only the newest few checkpoints and may prune this one
            # before or even during the load: that is a skip, not a validator failure.
            if not checkpoint_dir(policies.ckpt_root, policy_step).is_dir():
                return Verdict(
                    "skipped",
                    f"skipped: checkpoint {policy_step} was pruned before the file was judged",
                )
            raise
        return validate_rollouts(table, meta, model, tokenizer, cfg, settings)
    except UnusableInput as exc:
        return Verdict("unusable", f"unusable: {exc}")


def run_validator(cfg: RunConfig) -> dict[str, int]:
    """Judge the chosen files until the trainer is done; returns the verdict counts."""
    torch.set_num_threads(cfg.validator.threads)
    run_dir = cfg.run_dir
    secret = run_secret(run_dir)
    settings = ValidatorSettings(toploc=TOPLOC_PRESETS[cfg.validator.toploc])
    policies = _Policies(cfg.folder.checkpoints)
    out_path = cfg.folder.verdicts
    seen = {v["file"] for v in read_verdicts(run_dir)}
    passed: set[str] = set()  # files not chosen
    while True:
        done = cfg.folder.trainer_done.exists()  # read before listing: no file can be missed
        pending = [
            p
            for p in sorted(cfg.folder.rollouts.glob("step_*/*.parquet"))
            if str(p) not in seen and str(p) not in passed
        ]
        for path in pending:
            try:
                chosen = selected_for_validation(file_hash(path), secret, cfg.validator.fraction)
            except OSError:
                continue  # removed meanwhile
            if not chosen:
                passed.add(str(path))
                continue
            start = time.perf_counter()
            verdict = judge(path, cfg, policies, settings)
            record = {
                "file": str(path),
                "status": verdict.status,
                "reason": verdict.reason,
                "failed_checks": verdict.failed_checks,
                "seconds": round(time.perf_counter() - start, 3),
            }
            with open(out_path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
            seen.add(str(path))
            level = logging.INFO if verdict.status in ("accepted", "skipped") else logging.WARNING
            log.log(level, "%s: %s", path.name, verdict.reason)
        if done and not pending:
            return verdict_counts(run_dir)
        if not pending:
            time.sleep(cfg.validator.poll_seconds)
