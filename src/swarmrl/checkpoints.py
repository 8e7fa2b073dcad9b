"""Checkpoint directories: one Hugging Face model directory per step, written atomically.

Layout: `<run>/checkpoints/step_<n:06d>/` holds `config.json`, `model.safetensors` and
tokenizer files: exactly what is broadcast to workers. The trainer's own resume state
(model and optimizer shards, RNG, the step's metrics) is the folder
`<run>/checkpoints/trainer_state/step_<n:06d>/` (trainer/state.py), written before the
model folder appears. A checkpoint is written under a hidden temporary name and renamed
when complete, so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Collection, Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from swarmrl.model.lite import load_lite_model, load_lite_tokenizer
from swarmrl.runfolder import checkpoint_dir, list_checkpoints, step_name


def _model_dir(path: Path) -> Path:
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json)")
    return path


def load_tokenizer(path: Path):
    """The tokenizer of a model directory, the same object type in every role (workers,
    validator and trainer must turn a prompt into the same ids): the plain ``tokenizers``
    one where that is exactly what transformers would run, else transformers' own."""
    path = _model_dir(path)
    lite = load_lite_tokenizer(path)
    if lite is not None:
        return lite
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _transformers_model(path: Path):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # Loading a million-parameter checkpoint every step: per-load progress bars are noise.
    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def load_policy(path: Path):
    """(model in float32 eval mode, tokenizer) from any Hugging Face causal LM directory:
    what workers sample from, the validator prefills and the trainer trains and writes
    back (``save_pretrained``). A Llama-family model loads without transformers' classes
    (``model.lite``: seconds of imports less per process), any other through them."""
    path = _model_dir(path)
    model = load_lite_model(path)
    return (model if model is not None else _transformers_model(path)), load_tokenizer(path)


def write_rounded_copy(src: Path, dest: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Copy checkpoint ``src`` to ``dest`` with every floating weight rounded to ``dtype``
    (round to nearest even, torch's cast) and the config saying so; every other file as is.

    What a run with ``shardcast.dtype = "bf16"`` broadcasts: half the bytes of fp32, and
    consecutive copies differ only where an update crossed a rounding boundary, so their
    deltas are small. Readers (``load_policy``) compute in fp32 from the rounded values.
    Written under a temporary name and renamed, like a checkpoint.
    """
    src, dest = Path(src), Path(dest)
    name = str(dtype).removeprefix("torch.")
    with _written_whole(dest) as tmp:
        for entry in sorted(src.iterdir()):
            if entry.suffix == ".safetensors":
                weights = {
                    key: (t.to(dtype) if t.is_floating_point() else t).contiguous()
                    for key, t in load_file(entry).items()
                }
                save_file(weights, tmp / entry.name, metadata={"format": "pt"})
            elif entry.name == "config.json":
                config = json.loads(entry.read_text())
                for key in ("dtype", "torch_dtype"):
                    if key in config:
                        config[key] = name
                config.setdefault("dtype", name)
                (tmp / entry.name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            elif entry.is_file():
                shutil.copy2(entry, tmp / entry.name)
            else:
                raise ValueError(f"cannot round {src}: {entry.name} is not a file")
    return dest


@contextlib.contextmanager
def _written_whole(final: Path) -> Iterator[Path]:
    """An empty temporary folder beside ``final`` to fill; once the body is done it is
    renamed to ``final`` (replacing it), so a reader never sees half of one. On an error
    the temporary folder stays and ``final`` is untouched."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def trainer_state_path(root: Path, step: int) -> Path:
    """The folder of the trainer's resume state for checkpoint `step`."""
    return Path(root) / "trainer_state" / step_name(step)


def save_checkpoint(
    root: Path, step: int, model, tokenizer, state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write checkpoint `step` atomically and return its directory.

    `state_dict`: the full weights to write when `model` itself holds only a shard of them
    (the sharded trainer gathers them on rank 0); by default the model's own.
    """
    final = checkpoint_dir(root, step)
    with _written_whole(final) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
    return final


def prune_checkpoints(root: Path, keep: int, protect: Collection[int] = frozenset()) -> list[int]:
    """Remove all but the newest `keep` checkpoints (never those in `protect`)."""
    steps = list_checkpoints(root)
    removed = []
    for step in steps[:-keep] if keep > 0 else steps:
        if step in protect:
            continue
        # Rename first so a reader scanning the folder never sees a half-deleted checkpoint.
        doomed = checkpoint_dir(root, step)
        trash = doomed.with_name(f".{doomed.name}.deleting")
        os.replace(doomed, trash)
        shutil.rmtree(trash, ignore_errors=True)
        shutil.rmtree(trainer_state_path(root, step), ignore_errors=True)
        removed.append(step)
    return removed
