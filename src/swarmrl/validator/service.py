"""The validator process of a run: judge a secret random fraction of the rollout files as
they arrive, and write one verdict per judged file.

- Which files: ``selected_for_validation(file hash, secret, fraction)``. The secret is
  made once per run, 32 random bytes in ``<run>/validator/secret`` (mode 0600). On one
  machine the workers could read it; in a real swarm only the validator holds it.
- Files are taken in arrival order (modification time, then name), as the trainer
  counts them. A file repeating one seen before (the same bytes, or an assignment
  already answered) is rejected as a duplicate, whether or not the earlier one was
  picked.
- Verdicts: one JSON line per judged file in ``<run>/validator/verdicts.jsonl``
  (``file``, ``file_hash``, ``assignment``, ``status``, ``reason``, ``failed_checks``,
  ``seconds``); a file the validator did not pick is not listed. A restarted validator
  reads the log, remembers the hashes and assignments it judged, and judges only the
  files it lacks.
- No file can stop it: an unexpected error while judging is logged with its traceback
  and recorded as ``unusable`` with its message, and the next file is judged.
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
from swarmrl.rollouts import AssignmentKey, RolloutFileError, SeenFiles, file_hash, read_meta
from swarmrl.runfolder import RunFolder
from swarmrl.tasks.registry import build_task
from swarmrl.validator.settings import TOPLOC_PRESETS, ValidatorSettings
from swarmrl.validator.verdict import Status, Verdict, judge_file, selected_for_validation

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
    return {status.value: counts.get(status.value, 0) for status in Status}


def _remembered(verdicts: list[dict]) -> SeenFiles:
    """The hashes and assignments of the files judged before a restart."""
    seen = SeenFiles()
    for v in verdicts:
        key = v.get("assignment")
        if v.get("file_hash") and isinstance(key, list) and 3 <= len(key) <= 4:
            seen.add(str(v["file"]), str(v["file_hash"]), AssignmentKey(*key))
    return seen


@dataclass
class _Policies:
    """Loaded checkpoints by policy step; only the newest few are kept in memory."""

    ckpt_root: Path
    keep: int = 3

    def __post_init__(self) -> None:
        self.loaded: dict[int, tuple] = {}

    def get(self, step: int) -> tuple | Verdict:
        """The policy, or a ``skipped`` verdict when the trainer has pruned its checkpoint."""
        if step not in self.loaded:
            try:
                self.loaded[step] = load_policy(checkpoint_dir(self.ckpt_root, step))
            except (OSError, ValueError):
                # The trainer keeps only the newest few checkpoints and may prune this one
                # before or even during the load: that is a skip, not a validator failure.
                if not checkpoint_dir(self.ckpt_root, step).is_dir():
                    return Verdict(
                        Status.SKIPPED,
                        f"skipped: checkpoint {step} was pruned before the file was judged",
                    )
                raise
            for old in sorted(self.loaded)[: -self.keep]:
                del self.loaded[old]
        return self.loaded[step]


def _arrivals(rollouts: Path) -> list[Path]:
    """Rollout files in arrival order: modification time, then name."""
    listed = []
    for path in rollouts.glob("step_*/*.parquet"):
        try:
            listed.append((path.stat().st_mtime_ns, path.name, path))
        except OSError:
            continue  # removed meanwhile
    return [path for *_, path in sorted(listed)]


def run_validator(cfg: RunConfig) -> dict[str, int]:
    """Judge the chosen files until the trainer is done; returns the verdict counts."""
    torch.set_num_threads(cfg.validator.threads)
    run_dir = cfg.run_dir
    secret = run_secret(run_dir)
    settings = ValidatorSettings(toploc=TOPLOC_PRESETS[cfg.validator.toploc])
    policies = _Policies(cfg.folder.checkpoints)
    task = build_task(cfg.task)  # once: a user's task re-reads its problem file when built
    out_path = cfg.folder.verdicts
    judged = read_verdicts(run_dir)
    done_paths = {v["file"] for v in judged}
    seen = _remembered(judged)
    passed: set[str] = set()  # files not chosen
    while True:
        done = cfg.folder.trainer_done.exists()  # read before listing: no file can be missed
        pending = [
            p
            for p in _arrivals(cfg.folder.rollouts)
            if str(p) not in done_paths and str(p) not in passed
        ]
        for path in pending:
            try:
                digest = file_hash(path)
            except OSError:
                continue  # removed meanwhile
            if not selected_for_validation(digest, secret, cfg.validator.fraction):
                passed.add(str(path))
                _remember(seen, path, digest)
                continue
            start = time.perf_counter()
            verdict = judge_file(path, cfg, policies.get, settings, seen, task)
            key = _remember(seen, path, digest) if verdict.status != Status.UNUSABLE else None
            record = {
                "file": str(path),
                "file_hash": digest,
                "assignment": list(key) if key else None,
                "status": verdict.status.value,
                "reason": verdict.reason,
                "failed_checks": verdict.failed_checks,
                "seconds": round(time.perf_counter() - start, 3),
            }
            with open(out_path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
            done_paths.add(str(path))
            quiet = verdict.status in (Status.ACCEPTED, Status.SKIPPED)
            log.log(logging.INFO if quiet else logging.WARNING, "%s: %s", path.name, verdict.reason)
        if done and not pending:
            return verdict_counts(run_dir)
        if not pending:
            time.sleep(cfg.validator.poll_seconds)


def _remember(seen: SeenFiles, path: Path, digest: str) -> AssignmentKey | None:
    """Count a readable file as seen (the first file of an assignment keeps it)."""
    try:
        key = AssignmentKey.of(read_meta(path))
    except (OSError, RolloutFileError):
        return None  # an unreadable file claims no assignment
    if seen.duplicate_reason(digest, key) is None:
        seen.add(str(path), digest, key)
    return key
