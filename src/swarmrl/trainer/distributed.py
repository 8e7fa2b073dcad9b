"""The trainer's process layout: one plain process, or N ranks under torchrun with FSDP2.

- `swarmrl trainer` started plainly is one process holding a plain module: no process
  group, no collectives (the CPU default and the reference the sharded path must match).
- Under torchrun (RANK and WORLD_SIZE in the environment) every rank joins the process
  group (NCCL on GPUs, gloo on CPUs) and the model is sharded with FSDP2
  (`fully_shard`): each decoder layer is its own unit, then the root (embeddings, final
  norm, LM head). Parameters, gradients and optimizer state live as 1/N shards per rank;
  a layer's full weights exist only while it computes.
- With `trainer.ranks` > 1 and no torchrun around it, `swarmrl trainer` replaces itself
  with `torchrun --standalone --nproc-per-node ranks` running the same command line.

Gradients are summed over ranks, not averaged: the loss is already divided by the
global token budget (update.py), so every rank's contribution is a share of one sum.
FSDP's divide factor is therefore 1, with plain SUM reductions (gloo has no PREMUL_SUM).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, NoReturn, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Ranks other than 0 wait in a broadcast while rank 0 waits for the step's rollouts, which
# takes as long as the swarm takes: the collectives' timeout must outlast any such wait.
COLLECTIVE_TIMEOUT = timedelta(days=1)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the trainer's processes."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    sharded: bool = False  # started by torchrun: FSDP2 module, collectives

    @property
    def is_main(self) -> bool:
        """Rank 0 alone reads rollouts, writes the published checkpoint and the metrics."""
        return self.rank == 0


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices natively: a GPU that supports bf16, or a
    CPU with AVX512-BF16 or AMX tiles. Elsewhere a bf16 product is emulated and slower
    than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def compute_precision(requested: str, native: bool) -> Literal["fp32", "bf16"]:
    """`trainer.precision` resolved: auto is bf16 where the device computes it natively
    (`native_bf16`), fp32 elsewhere; fp32 and bf16 are taken as asked."""
    if requested == "auto":
        return "bf16" if native else "fp32"
    if requested not in ("fp32", "bf16"):
        raise ValueError(f"trainer.precision {requested!r}: expected auto, fp32 or bf16")
    return cast(Literal["fp32", "bf16"], requested)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_argv(ranks: int, swarmrl_args: list[str]) -> list[str]:
    """The command line that runs `swarmrl <swarmrl_args>` as `ranks` processes on this
    machine (torchrun's standalone rendezvous picks a free local port)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        "-m",
        "swarmrl",
        *swarmrl_args,
    ]


def relaunch_under_torchrun(ranks: int) -> None:
    """Replace this process by torchrun running the same `swarmrl` command, when asked for
    more than one rank and not started by torchrun already. Same pid: a supervisor that
    signals this process (or its process group) reaches torchrun, which stops its ranks."""
    if ranks > 1 and not under_torchrun():
        argv = torchrun_argv(ranks, sys.argv[1:])
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(argv[0], argv)


def _die_with_launcher() -> None:
    # torchrun starts each rank in a session of its own, so a launcher killed with
    # SIGKILL (nothing forwarded) would leave its ranks training on, unsupervised.
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() == 1:  # the launcher died before the request took effect
            os._exit(1)


def join() -> Ranks:
    """Join the process group when started by torchrun; a plain process otherwise."""
    if not under_torchrun():
        return Ranks()
    _die_with_launcher()
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    return Ranks(dist.get_rank(), dist.get_world_size(), device, sharded=True)


def leave(ranks: Ranks) -> None:
    if ranks.sharded and dist.is_initialized():
        # Together: a rank that tears its connections down while another still finishes
        # its last step makes that rank's transport abort.
        dist.barrier()
        dist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End a rank's process, once it left the group, without the interpreter's shutdown.

    gloo's worker thread ("pt_gloo_runloop") drops its reference to the last collective
    after the rank stopped waiting on it; when that frees tensors Python had let go of,
    it takes the GIL to release their Python objects, and if the main thread is shutting
    the interpreter down by then the thread is cancelled inside C++ code and the process
    aborts (SIGABRT, "terminate called without an active exception") after a finished
    run: about one two-rank run in ten on a loaded 2-core machine, from a core dump of
    ~AsyncBarrierWork racing Py_FinalizeEx. Everything the rank writes is closed by now;
    its output streams and log handlers are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face causal LM: the classes it names as never to be
    split across devices (`_no_split_modules`, e.g. Qwen2DecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layer class (_no_split_modules): "
            "cannot shard it layer by layer"
        )
    return layers


def prepare_model(
    model: PreTrainedModel, ranks: Ranks, activation_checkpointing: bool, precision: str
) -> PreTrainedModel:
    """Activation checkpointing per decoder layer, then FSDP2 sharding (sharded ranks only).

    bf16, sharded: parameters are all-gathered and computed in bf16 while the shards the
    optimizer updates stay fp32 (the master weights), and gradients are reduced in fp32.
    bf16, one process: the model stays fp32 here; the update runs its forward passes
    under bf16 autocast (`UpdateSettings.autocast_bf16`).
    """
    if activation_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(
                f"trainer.activation_checkpointing: {type(model).__name__} does not support it"
            )
        # Non-reentrant checkpointing composes with FSDP2's hooks and needs no input grads.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not ranks.sharded:
        return model
    # FSDP and DTensor are imported here, by the sharded trainer alone: a second of CPU
    # that a one-process trainer would spend at its start, beside every other process's.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(ranks.device.type, (ranks.world,))
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if precision == "bf16"
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def all_sum(ranks: Ranks, values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64, so counts and sums stay exact enough)."""
    if not ranks.sharded:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=ranks.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_max(ranks: Ranks, value: float) -> float:
    """The largest of one value over ranks."""
    if not ranks.sharded:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=ranks.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def broadcast(ranks: Ranks, obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not ranks.sharded:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ranks: Ranks) -> None:
    if ranks.sharded:
        dist.barrier()


def full_state_dict(model: torch.nn.Module, ranks: Ranks) -> dict[str, torch.Tensor] | None:
    """The whole model's fp32 weights on rank 0's CPU (None on other ranks). Collective:
    every rank calls it; the shards are gathered one tensor at a time."""
    if not ranks.sharded:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return cast(dict[str, torch.Tensor], state) if ranks.is_main else None


def grad_norm_value(norm: torch.Tensor) -> float:
    """`clip_grad_norm_`'s result as a float; over FSDP2 shards it is a replicated DTensor."""
    full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return float(full)
