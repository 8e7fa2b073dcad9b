"""The inference worker process: a member of the pool that generates rollouts for its
assignments and uploads them to the orchestrator.

The worker lives in its own directory (`--workdir`, never the run folder): its key, its
policy cache (`policies/`), its outbox (`outbox/`) and its per-file stats
(`stats.jsonl`). Everything else comes from the orchestrator:

1. Register as a worker and heartbeat from a background thread (`Membership`), and once
   more before each request for work. Each answer says the current step, the async
   bound, the newest checkpoint and its BLAKE3, the relays, the trainer's origin, and
   whether the run is finished.
2. When a newer checkpoint is announced, fetch it through SHARDCAST from the relays (the
   origin if no relay is registered) on a background thread, check it is the announced
   one and, between assignments, load it (`policy_source.py`); meanwhile the worker keeps
   generating with the policy it holds, as far as the orchestrator's async bound lets it.
   A policy it cannot fetch or load (a relay still mirroring it, a bad shard) is retried
   with a doubling delay, logged each time.
3. Ask for an assignment with the policy step it holds. None (the steps it may serve are
   full, or its policy is too old): wait the `retry_seconds` the answer names.
4. Generate the assignment's prompts (`assign_from_seed` of the issued seed), score them,
   compute group advantages, and hand the file to the finisher (`finisher.py`: a
   background thread and one child process), which builds its TOPLOC proofs and writes
   `outbox/<assignment id>.parquet` while the next assignment is generated.
5. The finisher's thread uploads the file and deletes it once the orchestrator took it.
   A refusal (4xx) is logged and the file dropped: the orchestrator judged it, sending it
   again cannot help. Connection trouble and 5xx answers are retried with a doubling
   delay until the assignment's deadline.
6. Stop when the heartbeat says the run is finished, or when the pool ejected the
   worker (a rejected file slashed its stake: the orchestrator answers 403 `ejected: ...`).

A cheating worker (`--adversary KIND`, `adversary.py`) runs this same loop with one
step changed by its `Behaviour`.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from swarmrl.assignment import assign_from_seed
from swarmrl.backoff import backoff_delay
from swarmrl.config import RunConfig
from swarmrl.generation.rollout import RolloutBatch, Sampler, generate_rollouts
from swarmrl.generation.sampler import SamplingParams, sample
from swarmrl.identity import Identity
from swarmrl.inference.adversary import Behaviour
from swarmrl.inference.engines import EngineChoice
from swarmrl.inference.finisher import FileFinisher, FinishProcess
from swarmrl.inference.policy_source import PolicySource, Prefetch
from swarmrl.protocol import PoolClient, PoolRefused, recipe
from swarmrl.protocol import models as api
from swarmrl.protocol.membership import Membership, ejected, retryable
from swarmrl.rollouts import RolloutMeta
from swarmrl.shardcast.client import VersionUnavailableError
from swarmrl.tasks.base import Task
from swarmrl.tasks.registry import build_task

log = logging.getLogger("swarmrl.worker")

# What fetching or loading a policy can raise that is worth a later retry.
POLICY_TROUBLE = (OSError, RuntimeError, ValueError)
# How long an announced checkpoint may be missing from the relays before it is trouble.
UNLISTED_GRACE_SECONDS = 30.0
# How long a worker holding a policy waits for a newer one being fetched before it
# generates with the one it holds: on loopback or a LAN the fetch ends within this and
# the samples are a policy fresher; on a slow link it costs at most this per checkpoint.
FRESH_WAIT_SECONDS = 0.3


@dataclass(frozen=True)
class WorkerHome:
    """The files of one worker, all under its own directory."""

    root: Path

    @property
    def key(self) -> Path:
        return self.root / "key"

    @property
    def policies(self) -> Path:
        return self.root / "policies"

    @property
    def outbox(self) -> Path:
        return self.root / "outbox"

    @property
    def stats(self) -> Path:
        return self.root / "stats.jsonl"

    def outbox_file(self, assignment_id: int) -> Path:
        return self.outbox / f"{assignment_id}.parquet"


@dataclass
class WorkerCounts:
    """What a worker did: files written, uploaded, refused, and given up (never delivered)."""

    written: int = 0
    uploaded: int = 0
    refused: int = 0
    abandoned: int = 0


class Uploader:
    """Delivers outbox files to the orchestrator (called from the finisher's thread).

    A file is deleted once delivered or refused; on connection trouble it is retried with
    a doubling delay until its assignment's deadline or `stop`.
    """

    def __init__(
        self, client: PoolClient, counts: WorkerCounts, retry_base: float, retry_cap: float
    ) -> None:
        self.client = client
        self.counts = counts
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.stopped = threading.Event()

    def deliver(self, path: Path, assignment_id: int, deadline: float) -> bool:
        failures = 0
        while True:
            try:
                info = self.client.upload(assignment_id, path)
            except Exception as exc:
                if retryable(exc):
                    failures += 1
                    if self._wait_or_give_up(path, failures, deadline, exc):
                        return False
                    continue
                if not isinstance(exc, PoolRefused):
                    raise
                # Also the answer to a retry of an upload whose reply was lost: the
                # orchestrator already holds the file, and its assignment is closed.
                log.warning("upload of %s refused, dropping it: %s", path.name, exc)
                self.counts.refused += 1
                path.unlink(missing_ok=True)
                return False
            log.info(
                "uploaded assignment %d (step %d, %d samples, %d usable): %s",
                assignment_id,
                info.step,
                info.num_samples,
                info.num_nonzero,
                info.file_hash[:12],
            )
            self.counts.uploaded += 1
            path.unlink(missing_ok=True)
            return True

    def _wait_or_give_up(self, path: Path, failures: int, deadline: float, exc: Exception) -> bool:
        delay = backoff_delay(failures, self.retry_base, self.retry_cap)
        if self.stopped.is_set() or time.time() + delay > deadline:
            log.warning("giving up on %s (%s): its assignment lapses", path.name, exc)
            self.counts.abandoned += 1
            path.unlink(missing_ok=True)
            return True
        log.warning("upload of %s failed (%s); retry %d in %.1f s", path.name, exc, failures, delay)
        self.stopped.wait(delay)
        return False


def deliver_leftovers(home: WorkerHome, uploader: Uploader) -> None:
    """Files a previous life of this worker wrote but did not deliver: try each once more
    (the orchestrator refuses those whose assignment lapsed meanwhile)."""
    for path in sorted(home.outbox.glob("*.parquet")):
        try:
            assignment_id = int(path.stem)
        except ValueError:
            log.warning("removing %s: not an outbox file name", path)
            path.unlink(missing_ok=True)
            continue
        uploader.deliver(path, assignment_id, deadline=time.time())
    for part in home.outbox.glob(".*.tmp"):
        part.unlink(missing_ok=True)  # a write cut short


def generate_assignment(
    cfg: RunConfig,
    model,
    tok,
    task: Task,
    work: api.AssignmentInfo,
    policy_step: int,
    address: str,
    behaviour: Behaviour,
    sampler: Sampler = sample,
) -> tuple[RolloutBatch, RolloutMeta]:
    """The rollouts of an issued assignment (proofs not built yet) and the file's metadata,
    drawn by ``sampler`` (the native loop or the vLLM engine, ``engines.py``)."""
    batch = behaviour.generate(
        generate_rollouts,
        model=model,
        tokenizer=tok,
        task=task,
        assignment=assign_from_seed(
            work.seed,
            num_problems=task.num_train(),
            prompts=work.prompts,
            group_size=work.group_size,
            target_lengths=cfg.task.target_lengths,
        ),
        params=behaviour.sampling(
            SamplingParams(
                temperature=cfg.sampling.temperature,
                max_new_tokens=cfg.sampling.max_new_tokens,
                eos_token_id=tok.eos_token_id,
                top_p=cfg.sampling.top_p,
            )
        ),
        policy_step=policy_step,
        length_alpha=cfg.task.alpha_at(work.step),
        length_shaping=cfg.task.length_shaping,
        advantage_mode=cfg.task.advantage_mode,
        proofs=False,
        sampler=sampler,
    )
    meta = RolloutMeta(
        run_id=cfg.run_name,
        worker_address=address,
        step=work.step,
        submission=work.id,
        num_samples=len(batch.columns["problem_id"]),
        num_nonzero=batch.num_nonzero,
    )
    return batch, meta


def run_worker(
    cfg: RunConfig,
    orchestrator: str,
    identity: Identity,
    workdir: Path,
    behaviour: Behaviour | None = None,
    proof_process: FinishProcess | None = None,
) -> WorkerCounts:
    """Serve the pool until the run is finished; returns what this worker did. Raises
    `PoolRefused` when the pool refuses it for good (`ejected(exc)`: it was ejected).
    `behaviour`: an adversary's cheat (`adversary.py`); honest by default.
    `proof_process`: the child that builds the proofs, if started already (else one is
    started here)."""
    behaviour = behaviour or Behaviour()
    torch.set_num_threads(cfg.worker.threads)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    home = WorkerHome(Path(workdir))
    home.outbox.mkdir(parents=True, exist_ok=True)
    task = build_task(cfg.task)
    source = PolicySource(home.policies, deltas=cfg.shardcast.deltas)
    prefetch = Prefetch(source)
    counts = WorkerCounts()
    engines = EngineChoice(cfg)
    model = tok = None
    policy_step = -1  # the policy this worker generates with (and claims)
    loaded_step = -1  # the newest policy it loaded (newer than policy_step with a policy lag)
    held: dict[int, tuple] = {}  # loaded policies by step, kept while a lag may need them
    retry_cap = cfg.supervision.backoff_max_seconds
    holding: set[int] = set()  # assignments taken and not yet delivered: beat faster

    member = Membership(
        orchestrator,
        identity,
        "worker",
        policy_step=lambda: policy_step if policy_step >= 0 else None,
        busy=lambda: bool(holding),
        recipe=recipe.of_run(cfg, "worker"),
        retry_base=cfg.worker.poll_seconds,
        retry_cap=retry_cap,
    )
    client = PoolClient(orchestrator, identity)
    uploader = Uploader(
        PoolClient(orchestrator, identity), counts, cfg.worker.poll_seconds, retry_cap
    )
    deadlines: dict[int, float] = {}

    def on_written(path: Path, batch: RolloutBatch, meta: RolloutMeta, waited: float) -> None:
        """Runs in the finisher's thread after each write: one stats line, then the upload."""
        counts.written += 1
        with open(home.stats, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "time": time.time(),
                        "file": str(path),
                        "assignment": meta.submission,
                        "step": meta.step,
                        "policy_step": batch.columns["policy_step"][0],
                        "bytes_by_server": dict(source.bytes_by_server),
                        "policy_fetches": dict(source.fetches),
                        "gen_seconds": round(batch.gen_seconds, 4),
                        "gen_tokens": batch.gen_tokens,
                        "proof_seconds": round(batch.proof_seconds, 4),
                        "proof_wait_seconds": round(waited, 4),
                        "nonzero": batch.num_nonzero,
                    }
                )
                + "\n"
            )
        behaviour.tamper(path, meta)
        try:
            uploader.deliver(path, meta.submission, deadlines.pop(meta.submission))
        finally:
            holding.discard(meta.submission)
            member.nudge()

    # Trouble fetching or loading the newest policy is retried with a doubling delay, not
    # on every poll; meanwhile the worker generates with the policy it holds.
    failures = 0
    retry_at = 0.0
    unlisted_since: float | None = None

    def trouble(what: str, exc: Exception) -> None:
        nonlocal failures, retry_at
        failures += 1
        delay = backoff_delay(failures, cfg.worker.poll_seconds, retry_cap)
        retry_at = time.monotonic() + delay
        held = (
            f"generating with policy {policy_step} meanwhile"
            if model is not None
            else "no policy yet"
        )
        log.warning("%s (%s); %s; retry %d in %.1f s", what, exc, held, failures, delay)

    view = member.start()
    deliver_leftovers(home, uploader)
    finisher = FileFinisher(on_written, child=proof_process)
    try:
        while True:
            # A fresh view before each assignment: a worker that learns of a new checkpoint
            # only from its periodic heartbeat generates with a staler policy, and
            # staleness costs learning (see the async bound in docs/architecture.md).
            try:
                view = member.beat()
            except Exception as exc:  # the heartbeat thread keeps retrying
                if ejected(exc):
                    raise
                log.warning("heartbeat failed (%s); going by the last answer", exc)
                view = member.view() or view
            if view.finished:
                break
            announced = view.checkpoint
            if (
                announced is not None
                and announced.step > loaded_step
                and not prefetch.busy
                and time.monotonic() >= retry_at
            ):
                # Fetched on a background thread: the worker keeps generating meanwhile.
                prefetch.start(
                    view.checkpoint_servers(with_origin=cfg.shardcast.workers_fetch_origin),
                    announced,
                )
                # Once per fetch, a short wait: on a fast link the new policy is in by
                # then and the samples are a policy fresher; on a slow one the worker
                # goes on with the policy it holds.
                prefetch.wait(FRESH_WAIT_SECONDS)
            if model is None:
                prefetch.wait()  # nothing to generate with until the first policy is in
            if prefetch.ready:
                fetched = prefetch.checkpoint
                assert fetched is not None
                try:
                    new_model, new_tok = source.open(prefetch.take())
                    loaded_step = fetched.step
                    held[loaded_step] = (behaviour.policy(new_model), new_tok)
                    # worker.policy_lag (benchmarks): the oldest held policy within the lag.
                    policy_step = min(s for s in held if s >= loaded_step - cfg.worker.policy_lag)
                    model, tok = held[policy_step]
                    for older in [s for s in held if s < policy_step]:
                        del held[older]
                    failures = 0
                    unlisted_since = None
                    log.info("loaded policy step %d, generating with %d", loaded_step, policy_step)
                    # Say so now, not at the next scheduled beat: the pool times each
                    # checkpoint's spread by the heartbeats that report it.
                    try:
                        member.beat()
                    except Exception as exc:  # noqa: BLE001 - the heartbeat thread retries
                        log.debug("beat after loading policy %d failed: %s", loaded_step, exc)
                except VersionUnavailableError as exc:
                    # Relays list a checkpoint once they mirrored it, a moment after it
                    # was announced: look again soon, and only long waits are trouble.
                    now = time.monotonic()
                    unlisted_since = unlisted_since or now
                    if now - unlisted_since > UNLISTED_GRACE_SECONDS:
                        trouble(f"policy {fetched.step} is still not listed", exc)
                    else:
                        retry_at = now + cfg.worker.poll_seconds
                except POLICY_TROUBLE as exc:
                    trouble(f"could not fetch policy {fetched.step}", exc)
            if model is None or tok is None:
                prefetch.pause(cfg.worker.poll_seconds)
                continue
            try:
                answer = client.assignment(policy_step)
            except Exception as exc:
                if not retryable(exc):
                    raise
                log.warning("cannot ask for an assignment (%s); retrying", exc)
                time.sleep(backoff_delay(2, cfg.worker.poll_seconds, retry_cap))
                continue
            work = answer.assignment
            if work is None:
                log.debug("no assignment: %s", answer.reason)
                prefetch.pause(answer.retry_seconds or cfg.worker.poll_seconds)
                continue
            holding.add(work.id)
            member.nudge()
            batch, meta = generate_assignment(
                cfg,
                model,
                tok,
                task,
                work,
                policy_step,
                identity.address,
                behaviour,
                engines.sampler(model),
            )
            deadlines[work.id] = work.deadline
            finisher.submit(home.outbox_file(work.id), batch, meta)
    finally:
        # The file in flight is still delivered, unless the run is over; when stopped
        # (SIGTERM, Ctrl-C) it gets one try, no retries.
        if (member.view() or view).finished or isinstance(
            sys.exception(), SystemExit | KeyboardInterrupt
        ):
            uploader.stopped.set()
        prefetch.close()
        try:
            finisher.close()
        finally:
            member.stop()
            client.close()
            uploader.client.close()
    return counts
