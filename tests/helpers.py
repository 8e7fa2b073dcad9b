"""Test helpers imported by several test modules (tests/ is on pytest's `pythonpath`)."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from swarmrl.model.tokenizer import build_char_tokenizer

# Flags of every whole-swarm run on the warm test model (conftest's WARM_RECIPE). It
# rarely answers right: under the default scaled length reward a wrong answer scores 0
# whatever its length, nearly every group has zero advantage and the trainer waits
# minutes for a batch. The subtracted length reward gives every group a signal.
WARM_MODEL_FLAGS = ["--task.length_shaping", "subtract"]


def random_model(
    kind: str = "llama", hidden: int = 64, layers: int = 2, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A random-init tiny causal LM (`llama` or `qwen2`) with the char tokenizer."""
    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    common = {
        "vocab_size": len(tok),
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    model = (
        LlamaForCausalLM(LlamaConfig(**common))
        if kind == "llama"
        else Qwen2ForCausalLM(Qwen2Config(**common))
    )
    return model.eval(), tok


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]
) -> Path:
    """The folder `name`, filled by `build` once per test run: the first xdist worker to
    ask builds it (the others wait on a lock), and every worker reads the same files."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, above each worker's own
    folder = root / name
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def vllm_only() -> pytest.MarkDecorator:
    """Skips a test where vLLM does not import (the main venv), with the reason; where
    SWARMRL_VLLM_REQUIRED is set (`.ci/run`, in the vLLM venv) its absence is an error."""
    from swarmrl.generation.vllm_engine import vllm_available

    missing = vllm_available()
    if missing is not None and os.environ.get("SWARMRL_VLLM_REQUIRED"):
        raise RuntimeError(f"SWARMRL_VLLM_REQUIRED is set, but {missing}")
    return pytest.mark.skipif(
        missing is not None,
        reason=f"{missing}; the vLLM tests run in the vLLM venv (`pip install -e .[vllm]`)",
    )


def settled_shard_bytes(stats, quiet: float = 0.3, timeout: float = 10.0) -> int:
    """A shardcast server's shard-byte count once no response is still being counted.

    The server counts a response when sendfile returns, which can be after the client has
    read the last byte; the count is taken once it has not moved for `quiet` seconds.
    """
    value, since, deadline = stats.shard_bytes, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = stats.shard_bytes
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return value


def wait_for_shard_bytes(stats, expected: int, timeout: float = 10.0) -> int:
    """The server's shard-byte count once it reaches `expected` (or the timeout passes)."""
    deadline = time.monotonic() + timeout
    while stats.shard_bytes != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return stats.shard_bytes
