"""The finisher's child process: builds a rollout file's TOPLOC proofs and writes the file.

Only what the child runs lives here, so that a spawned child imports torch, the TOPLOC
proofs and the rollout format and nothing else: no sampler, no model classes. Those
imports happen in the child only (`child_setup`): the parent imports this module to
spawn the child before its own heavy imports (`commands/roles.py`), so the child is
ready by the time the first file is generated.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from swarmrl.rollouts import RolloutMeta


def child_setup(parent: int) -> None:
    """Run once in the child: the proof code imported now, before the first file needs
    it; one thread; signals left to the parent; an exit when the parent is gone."""
    import torch

    import swarmrl.rollouts
    import swarmrl.toploc.proofs  # noqa: F401 - imported now, not at the first file

    torch.set_num_threads(1)
    # Ctrl-C, and a supervisor's SIGTERM, go to the whole group: the parent shuts the
    # child down (and releases what they share), rather than the child dying under it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A parent killed outright (SIGKILL, out of memory) cannot shut the child down; the
    # child sees itself re-parented and exits rather than living on idle.
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def finish_in_child(
    path: Path, columns: dict[str, list], meta: RolloutMeta, bits: np.ndarray, lengths: list[int]
) -> tuple[Path, list[bytes], float]:
    """Build the proofs of each sequence (rows of ``bits``: int16 views of bf16, split by
    ``lengths``), put them in the file's columns and write it. Returns (path, proofs,
    seconds spent on the proofs)."""
    import torch

    from swarmrl.rollouts import write_rollouts
    from swarmrl.toploc import proof_column

    start = time.perf_counter()
    proofs = proof_column(list(torch.from_numpy(bits).view(torch.bfloat16).split(lengths)))
    seconds = time.perf_counter() - start
    written = write_rollouts(path, {**columns, "proofs": proofs}, meta)
    return written, proofs, seconds
