"""The trainer's rollouts from the orchestrator: a step's submissions, downloaded,
checked and rescored by the trainer itself.

Each poll lists the step's live submissions, downloads the new ones into the inbox
(`<run>/trainer/inbox/step_<n>/<sha256>.parquet`, hash-checked by the client; a file
already there from before a restart is reused once its hash matches), and hands each
to the batch collector with the trainer's rescoring (trainer/rescoring.py): the
worker's rewards and advantages are never trained on. After each poll the trainer
reports its own count of the step (`report_progress`): the orchestrator issues work
by it, not by the workers' claims, and stops once the trainer says the step is full.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.protocol import PoolClient, PoolRefused, PoolUnreachable
from swarmrl.rollouts import LOOSE_BOUNDS, RolloutBounds, file_hash
from swarmrl.tasks.base import Task
from swarmrl.trainer.batches import BatchCollector, Sample, step_is_full
from swarmrl.trainer.rescoring import Rescorer

log = logging.getLogger("swarmrl.trainer")


@dataclass
class PoolStepCollector(BatchCollector):
    """A step's samples from the orchestrator's submissions (see the module docstring)."""

    client: PoolClient | None = None
    inbox: Path = Path()
    rescorer: Rescorer | None = None
    batch_samples: int = 0
    max_read_ratio: float = 0.0
    files: dict[int, str] = field(default_factory=dict)  # id(rows) → file hash
    processed: list[str] = field(default_factory=list)  # every file hash read or refused

    @property
    def mismatched_files(self) -> int:
        return len(self.rescorer.mismatched) if self.rescorer else 0

    def poll(self) -> None:
        assert self.client is not None and self.rescorer is not None
        try:
            listed = self.client.submissions_for_step(self.step).submissions
        except (PoolRefused, PoolUnreachable) as exc:
            log.warning("step %d: cannot list submissions: %s", self.step, exc)
            return
        new = [sub for sub in listed if sub.file_hash not in self.seen]
        for sub in new:
            path = self.inbox / f"{sub.file_hash}.parquet"
            try:
                if not (path.is_file() and file_hash(path) == sub.file_hash):
                    self.inbox.mkdir(parents=True, exist_ok=True)
                    self.client.download(sub.file_hash, path)
            except PoolUnreachable as exc:
                log.warning("step %d: %s; trying again at the next poll", self.step, exc)
                break
            except (PoolRefused, OSError) as exc:
                # Voided or rejected meanwhile, or a download that kept failing its hash.
                log.warning("step %d: skipped submission %s: %s", self.step, sub.file_hash, exc)
                self.seen.add(sub.file_hash)
                self.processed.append(sub.file_hash)
                continue
            if sub.seed is not None:
                self.rescorer.seeds[path.name] = sub.seed
            before = len(self.groups)
            self.add_file(path, sub.file_hash, self.rescorer)
            self.processed.append(sub.file_hash)
            for group in self.groups[before:]:
                self.files[id(group[0].rows)] = sub.file_hash
        if new:
            self.report()

    def drop_withdrawn(self) -> int:
        """Forget the groups of files no longer live (rejected by a validator, or voided,
        since they were read); returns the samples dropped."""
        assert self.client is not None
        live = {sub.file_hash for sub in self.client.submissions_for_step(self.step).submissions}
        kept = [g for g in self.groups if self.files[id(g[0].rows)] in live]
        dropped = sum(map(len, self.groups)) - sum(map(len, kept))
        if dropped:
            log.warning(
                "step %d: %d samples dropped: their files were withdrawn after being read",
                self.step,
                dropped,
            )
        self.groups = kept
        if dropped:
            # A step reported full may be short now: the orchestrator issues by the count.
            self.report()
        return dropped

    def report(self, full: bool = False) -> None:
        """The trainer's own count of the step, to the orchestrator (best effort: the next
        poll reports again)."""
        assert self.client is not None
        try:
            self.client.report_progress(
                self.step,
                usable=self.usable,
                read=len(self.all_rewards),
                files=self.processed,
                # Full as soon as the trainer will train it (in the report that counts
                # the file that filled it), so the orchestrator issues nothing more.
                full=full
                or step_is_full(
                    self.usable, len(self.all_rewards), self.batch_samples, self.max_read_ratio
                ),
            )
        except (PoolRefused, PoolUnreachable) as exc:
            log.warning("step %d: progress report failed: %s", self.step, exc)

    def files_of(self, samples: list[Sample]) -> list[str]:
        """Hashes of the files the samples came from, in first-use order."""
        return list(dict.fromkeys(self.files[id(s.rows)] for s in samples))


@dataclass(frozen=True)
class PoolRolloutSource:
    """`RolloutSource` over the orchestrator: one `PoolStepCollector` per step."""

    client: PoolClient
    inbox_dir: Path
    task: Task
    cfg: RunConfig
    tokenizer: object
    bounds: RolloutBounds = LOOSE_BOUNDS

    def open_step(self, step: int) -> PoolStepCollector:
        return PoolStepCollector(
            step,
            self.cfg.async_level,
            self.bounds,
            client=self.client,
            inbox=Path(self.inbox_dir) / f"step_{step}",
            rescorer=Rescorer(self.cfg, self.task, self.tokenizer),
            batch_samples=self.cfg.trainer.batch_samples,
            max_read_ratio=self.cfg.trainer.max_read_ratio,
        )
