"""Finishing rollout files off the generation loop: TOPLOC proofs, then the atomic write.

The worker hands each generated file to a ``FileFinisher`` and goes straight back to
sampling. The finisher's thread sends the file (its columns and hidden states) to a
``FinishProcess``, one child process (``proof_child.py``), which builds the proofs and
writes the file atomically; the thread only waits for it.

Why a process and not just the thread: proof building is many numpy calls, building
the Parquet file is Python-level work over the columns, and the sampling loop is many
small torch calls; in one process they take turns on the GIL and slow each other
(``benchmarks/bench_proof_pipeline.py``: with everything in the thread the loop lost as
much time as with proofs built inline). In a child process the work runs on another
core and costs the loop only pickling the columns and the hidden states (bf16, about
0.8 MB per default file).

The child is spawned when the ``FinishProcess`` is made, and imports its code at once:
a worker makes it first thing, so the child's start (seconds of imports) runs beside
the worker's own rather than holding up the first file. This module imports torch and
the generation code only where a file is finished, for the same reason.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swarmrl.inference import proof_child

if TYPE_CHECKING:
    from swarmrl.generation.rollout import RolloutBatch
    from swarmrl.rollouts import RolloutMeta

log = logging.getLogger("swarmrl.worker")


class FinishProcess:
    """Builds a file's TOPLOC proofs and writes it in one child process, spawned on creation.

    A child that dies (killed, out of memory) is replaced and the file retried once; the
    write is atomic, so a file is never left half written.
    """

    def __init__(self) -> None:
        self._pool = self._spawn()
        self.restarts = 0

    @staticmethod
    def _spawn() -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(
            1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=proof_child.child_setup,
            initargs=(os.getpid(),),
        )
        # The pool starts its process on the first task: start it now.
        pool.submit(os.getpid)
        return pool

    def finish(self, path: Path, batch: RolloutBatch, meta: RolloutMeta) -> Path:
        """``attach_proofs`` then ``write_rollouts``, in the child: same proof bytes, same file."""
        import torch

        states = [g.hidden for g in batch.generations if g.hidden is not None]
        if len(states) != len(batch.generations):
            raise ValueError("proofs need the hidden states: generate with capture_hidden=True")
        job = functools.partial(
            proof_child.finish_in_child,
            path,
            {k: v for k, v in batch.columns.items() if k != "proofs"},
            meta,
            torch.cat(states).view(torch.int16).numpy(),
            [len(s) for s in states],
        )
        try:
            written, proofs, seconds = self._pool.submit(job).result()
        except BrokenProcessPool:
            log.warning("the proof process died; starting a new one and retrying %s", path.name)
            self._pool.shutdown(wait=False)
            self._pool = self._spawn()
            self.restarts += 1
            written, proofs, seconds = self._pool.submit(job).result()
        batch.columns["proofs"] = proofs
        batch.proof_seconds = seconds
        return written

    def pid(self) -> int:
        """The child's process id."""
        return self._pool.submit(os.getpid).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass(frozen=True)
class InFlight:
    """The file the finisher is working on."""

    step: int
    submission: int
    num_nonzero: int


class FileFinisher:
    """Builds each rollout file's TOPLOC proofs and writes it, in a background thread.

    ``submit`` first waits for the file before it (so one file at most is in flight and
    memory stays bounded); that wait is the only time proof building holds up the
    caller, and ``wait_seconds`` adds it up. Proofs are built in a ``FinishProcess`` when
    ``processes`` is true, else in the thread itself. ``on_written(path, batch, meta,
    waited)`` runs in the thread after each write. An error in the thread is raised by
    the next ``submit``, ``in_flight`` or ``close``.
    """

    def __init__(
        self,
        on_written: Callable[[Path, RolloutBatch, RolloutMeta, float], None] | None = None,
        processes: bool = True,
        child: FinishProcess | None = None,
    ) -> None:
        self._child = child or (FinishProcess() if processes else None)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarmrl-finisher")
        self._on_written = on_written
        self._future: Future | None = None
        self._in_flight: InFlight | None = None
        self.wait_seconds = 0.0
        self.written = 0

    def in_flight(self) -> InFlight | None:
        """The file not yet written, if any (a finished one is collected first)."""
        if self._future is not None and self._future.done():
            self._wait()
        return self._in_flight

    def submit(self, path: Path, batch: RolloutBatch, meta: RolloutMeta) -> float:
        """Queue a file; returns the seconds spent waiting for the previous one."""
        waited = self._wait()
        self._in_flight = InFlight(meta.step, meta.submission, meta.num_nonzero)
        self._future = self._pool.submit(self._finish, path, batch, meta, waited)
        return waited

    def drain(self) -> None:
        """Wait until the file in flight is written."""
        self._wait()

    def close(self) -> None:
        """Write the file in flight, then stop the thread and the child process."""
        try:
            self._wait()
        finally:
            self._pool.shutdown(wait=True)
            if self._child is not None:
                self._child.close()

    def _wait(self) -> float:
        if self._future is None:
            return 0.0
        start = time.perf_counter()
        future, self._future = self._future, None
        try:
            future.result()
        finally:
            self._in_flight = None
        waited = time.perf_counter() - start
        self.wait_seconds += waited
        return waited

    def _finish(self, path: Path, batch: RolloutBatch, meta: RolloutMeta, waited: float) -> None:
        if self._child is not None:
            written = self._child.finish(path, batch, meta)
        else:
            from swarmrl.generation.rollout import attach_proofs
            from swarmrl.rollouts import write_rollouts

            attach_proofs(batch)
            written = write_rollouts(path, batch.columns, meta)
        self.written += 1
        if self._on_written is not None:
            self._on_written(written, batch, meta, waited)
