"""The trainer's resumable state, saved sharded with torch.distributed.checkpoint (DCP).

`checkpoints/trainer_state/step_<n>/` holds DCP's files for the model and the optimizer
(each rank writes its own shards, so no rank ever holds the whole optimizer state) and
`progress.pt`, written by rank 0: the step, the optimizer step count, the RNG states and
the step's metrics record. The folder is written under a hidden temporary name and
renamed by rank 0 once every rank has written its part, before the step's model folder
appears: a model folder that exists always has its state.

The plain one-process trainer writes the same layout (DCP without a process group).
Resuming at the same world size restores the run exactly. At another world size DCP
reshards the model and optimizer on load (tested from 2 ranks to 1); the data order
does not depend on the world size, so such a resume continues the same run up to
floating-point summation order.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from swarmrl.trainer.distributed import Ranks, barrier

# torch.distributed.checkpoint (and the DTensor code it loads: most of a second of CPU) is
# imported at the first save or load, not with the trainer: a one-process trainer's start
# is on the path to the first checkpoint the workers wait for.

PROGRESS = "progress.pt"


@contextlib.contextmanager
def _plain_process_quiet(ranks: Ranks) -> Iterator[None]:
    """DCP warns on every save and load that it is 'assuming ... a single process' when
    no process group exists: in a plain (unsharded) trainer that is the intent, not news."""
    with warnings.catch_warnings():
        if not ranks.sharded:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            warnings.filterwarnings("ignore", message="torch.distributed is unavailable")
        yield


def save_trainer_state(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, progress: dict, ranks: Ranks
) -> None:
    """Write the state atomically (collective: every rank calls it with the same path).
    `progress` (plain Python values) is written by rank 0, with rank 0's RNG states."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if ranks.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(ranks)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    with _plain_process_quiet(ranks):
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp)
    if ranks.is_main:
        torch.save(
            {**progress, "python_rng": random.getstate(), "torch_rng": torch.get_rng_state()},
            tmp / PROGRESS,
        )
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    barrier(ranks)


def load_trainer_state(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, ranks: Ranks
) -> dict:
    """Restore model, optimizer and RNG states in place; returns the saved progress."""
    path = Path(path)
    if not (path / PROGRESS).exists():
        raise FileNotFoundError(
            f"{path} is not a complete trainer state (no {PROGRESS}); remove it and its "
            "checkpoint folder to resume from the one before"
        )
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, opt)
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    with _plain_process_quiet(ranks):
        dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    progress = torch.load(path / PROGRESS, weights_only=False)
    random.setstate(progress.pop("python_rng"))
    torch.set_rng_state(progress.pop("torch_rng"))
    return progress
