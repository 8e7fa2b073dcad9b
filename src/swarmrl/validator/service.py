"""The validator process of a pool: judge the files the orchestrator hands out, and post
one signed verdict per file.

- Which files: the orchestrator's choice (HMAC of its secret and the file hash against
  its validation fraction); a worker cannot tell which of its files will be checked.
  `next_for_validation` hands out one file at a time, leased: a validator killed while
  judging gets it back when it registers again, another validator once the lease runs
  out.
- Each file is downloaded into ``<run>/validator/inbox/`` (hash-checked), judged with
  every check (verdict.py) against the prompts its assignment's seed gives and the
  claimed checkpoint, fetched through SHARDCAST from the relays the heartbeat names (the
  origin if none), and the verdict is posted (`accepted`, or rejected with its reason;
  an unusable file is rejected with the reason it is unusable).
- Verdicts are also appended to ``<run>/validator/verdicts.jsonl`` (``file``,
  ``file_hash``, ``assignment``, ``status``, ``reason``, ``failed_checks``, ``seconds``),
  which the run's summary counts.
- A file whose checkpoint the relays no longer list (they keep the newest few) is
  logged as ``skipped`` and gets a soft verdict: the file is voided (the trainer must
  not wait for it, nor train it unchecked), and the worker is not slashed.
- No file can stop it: an unexpected error while judging is logged with its traceback
  and the file is rejected as unusable with its message.
- It ends once the trainer has published its final checkpoint and nothing is left to judge.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swarmrl.checkpoints import load_policy
from swarmrl.config import RunConfig
from swarmrl.jsonl import read_jsonl
from swarmrl.protocol import PoolClient, PoolRefused, PoolUnreachable, recipe
from swarmrl.protocol import models as api
from swarmrl.protocol.membership import Membership, retryable
from swarmrl.rollouts import AssignmentKey, RolloutFileError, SeenFiles, read_meta
from swarmrl.runfolder import RunFolder
from swarmrl.shardcast.client import FetchError, fetch
from swarmrl.tasks.registry import build_task
from swarmrl.toploc.thresholds import TOPLOC_PRESETS
from swarmrl.validator.settings import ValidatorSettings
from swarmrl.validator.verdict import Status, Verdict, judge_file

log = logging.getLogger("swarmrl.validator")
# Pause before asking the orchestrator again after an answer worth retrying (unreachable,
# a 5xx, 429 over the rate limit).
RETRY_SECONDS = 1.0


def read_verdicts(run_dir: Path) -> list[dict]:
    """Every verdict line written so far (a line cut short by a kill is skipped)."""
    return read_jsonl(RunFolder(run_dir).verdicts)


def verdict_counts(run_dir: Path) -> dict[str, int]:
    """Judged files by status (accepted, rejected, unusable, skipped)."""
    counts = Counter(v.get("status") for v in read_verdicts(run_dir))
    return {status.value: counts.get(status.value, 0) for status in Status}


@dataclass
class _Policies:
    """Checkpoints by policy step, fetched through SHARDCAST; the newest few kept loaded."""

    cache: Path
    servers: list[str] = field(default_factory=list)
    keep: int = 3
    timeout: float = 10.0

    def __post_init__(self) -> None:
        self.loaded: dict[int, tuple] = {}

    def get(self, step: int) -> tuple | Verdict:
        """The policy, or a ``skipped`` verdict when no server lists it any more."""
        if step not in self.loaded:
            try:
                result = fetch(self.servers, step, self.cache, timeout=self.timeout)
            except FetchError as exc:
                # Relays keep the newest few versions: an old one gone is a skip, not a
                # validator failure, and nothing against the worker.
                return Verdict(
                    Status.SKIPPED, f"skipped: checkpoint {step} cannot be fetched ({exc})"
                )
            self.loaded[step] = load_policy(result.path)
            for old in sorted(self.loaded)[: -self.keep]:
                del self.loaded[old]
                shutil.rmtree(self.cache / f"v{old}", ignore_errors=True)
        return self.loaded[step]


def judge_submission(
    client: PoolClient,
    task_: api.ValidationTask,
    cfg: RunConfig,
    policies: _Policies,
    settings: ValidatorSettings,
    task,
) -> dict:
    """Download, judge and answer one handed-out file; returns its verdict record."""
    sub, assignment = task_.submission, task_.assignment
    assert sub is not None and assignment is not None
    inbox = cfg.folder.validator_inbox
    inbox.mkdir(parents=True, exist_ok=True)
    path = inbox / f"{sub.file_hash}.parquet"
    start = time.perf_counter()
    client.download(sub.file_hash, path)
    # The orchestrator keeps one submission per assignment and per hash: no duplicates
    # can reach a validator, so each file is judged on its own.
    verdict = judge_file(path, cfg, policies.get, settings, SeenFiles(), task, seed=assignment.seed)
    try:
        key = list(AssignmentKey.of(read_meta(path)))
    except (OSError, RolloutFileError):
        key = None
    record = {
        "file": str(path),
        "file_hash": sub.file_hash,
        "assignment": key,
        "status": verdict.status.value,
        "reason": verdict.reason,
        "failed_checks": verdict.failed_checks,
        "seconds": round(time.perf_counter() - start, 3),
    }
    accepted = verdict.status == Status.ACCEPTED
    try:
        client.post_verdict(
            sub.file_hash,
            accepted,
            "" if accepted else verdict.reason,
            soft=verdict.status == Status.SKIPPED,
        )
    except PoolRefused as exc:
        # A conflict: already decided (a verdict posted before a restart), or voided
        # meanwhile (its worker was ejected).
        if exc.code != "conflict":
            raise
    path.unlink(missing_ok=True)
    return record


def run_validator(cfg: RunConfig, client: PoolClient) -> dict[str, int]:
    """Judge what the orchestrator hands out until the run is finished; returns the
    verdict counts."""
    assert client.identity is not None
    torch.set_num_threads(cfg.validator.threads)
    settings = ValidatorSettings(toploc=TOPLOC_PRESETS[cfg.validator.toploc])
    policies = _Policies(cfg.folder.validator / "policies")
    task = build_task(cfg.task)  # once: a user's task re-reads its problem file when built
    out_path = cfg.folder.verdicts
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Heartbeats from a thread: judging one file may take longer than the orchestrator
    # waits before it declares a silent member dead.
    membership = Membership(
        client.url, client.identity, "validator", recipe=recipe.of_run(cfg, "validator")
    )
    view = membership.start()
    try:
        while True:
            view = membership.view() or view
            policies.servers = view.checkpoint_servers(with_origin=True)
            asked = time.monotonic()
            try:
                handed = client.next_for_validation(wait=cfg.validator.wait_seconds)
            except (PoolRefused, PoolUnreachable) as exc:
                if not retryable(exc):
                    raise
                # Unreachable, a 5xx, or over the rate limit (a fast validator can be):
                # wait, then ask again.
                log.warning("%s; trying again in %.1f s", exc, RETRY_SECONDS)
                time.sleep(RETRY_SECONDS)
                continue
            if handed.submission is None:
                # Held for the whole wait: ask again at once. Answered early though a wait
                # was asked (the run is over: the orchestrator holds nothing after its
                # last checkpoint), hear it now rather than at the next heartbeat. Early
                # (or no wait asked): pause before asking again.
                wait = cfg.validator.wait_seconds
                early = wait <= 0 or time.monotonic() - asked < wait / 2
                if wait > 0 and early and not view.finished:
                    with contextlib.suppress(PoolRefused, PoolUnreachable):
                        view = membership.beat()
                if view.finished:
                    return verdict_counts(cfg.run_dir)
                if early:
                    time.sleep(cfg.validator.poll_seconds)
                continue
            try:
                record = judge_submission(client, handed, cfg, policies, settings, task)
            except (PoolRefused, PoolUnreachable) as exc:
                log.warning("submission %s: %s", handed.submission.file_hash, exc)
                if retryable(exc):
                    time.sleep(RETRY_SECONDS)  # its lease runs out; it is handed out again
                continue
            with open(out_path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
            quiet = record["status"] in (Status.ACCEPTED.value, Status.SKIPPED.value)
            log.log(
                logging.INFO if quiet else logging.WARNING,
                "%s: %s",
                handed.submission.file_hash[:12],
                record["reason"],
            )
    finally:
        membership.stop()
