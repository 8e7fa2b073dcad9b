"""Build, warm-start and cache the embedded default model.

The model is a standard Hugging Face `LlamaForCausalLM` (about a million parameters)
with the character tokenizer, warm-started by a short supervised run on the
arithmetic task's imperfect demonstrations (see `swarmrl.tasks.arithmetic`): it learns
the worked format and most digit sums, and inherits the demonstrations' dropped carries
and target-blind check lines, which RL then fixes.

The result is cached as an ordinary model directory (written under a temporary name and
renamed, so a crash never leaves half a model) and reused by every later run. torch and
transformers are imported where the model is built: finding the cached one does not load
them (`swarmrl run` starts its processes before its own heavy imports).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swarmrl.tasks.arithmetic import ArithmeticTask

if TYPE_CHECKING:
    from transformers import LlamaConfig

# v2: prompts end at the target (no newline); v3: a restatement opens with `(`
MODEL_NAME = "swarmrl-tiny-arith-v3"


@dataclass(frozen=True)
class WarmStartRecipe:
    """Everything that decides the embedded model; its values name the cache entry."""

    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    steps: int = 500
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 30
    carry_drop: float = 0.6
    verbose_prob: float = 0.5
    target_lengths: tuple[int, ...] = (32, 41)
    seed: int = 0


def default_cache_dir() -> Path:
    return Path(os.environ.get("SWARMRL_CACHE", Path.home() / ".cache" / "swarmrl"))


def _config(vocab_size: int, recipe: WarmStartRecipe, tok) -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=4 * recipe.hidden_size,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )


def _demo_batch(task: ArithmeticTask, tok, recipe: WarmStartRecipe, rng: random.Random):
    import torch

    seqs, masks = [], []
    for _ in range(recipe.batch_size):
        problem = task.train_problem(rng.randrange(task.num_train()))
        prompt = tok(task.render_prompt(problem, rng.choice(recipe.target_lengths)))["input_ids"]
        demo = task.demonstration(problem, rng, recipe.carry_drop, recipe.verbose_prob)
        completion = tok(demo)["input_ids"] + [tok.eos_token_id]
        seqs.append(prompt + completion)
        masks.append([0.0] * len(prompt) + [1.0] * len(completion))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros(len(seqs), width)
    for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        loss_mask[i, : len(s)] = torch.tensor(m)
    return ids, loss_mask


def warm_start(recipe: WarmStartRecipe, progress: Callable[[int, int, float], None] | None = None):
    """Train the tiny model on imperfect demonstrations; return (model, tokenizer)."""
    import torch
    from transformers import LlamaForCausalLM

    from swarmrl.model.tokenizer import build_char_tokenizer

    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    tok = build_char_tokenizer()
    model = LlamaForCausalLM(_config(len(tok), recipe, tok))
    task = ArithmeticTask()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.01)
    model.train()
    for step in range(recipe.steps):
        warm = min(1.0, (step + 1) / recipe.warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * step / recipe.steps))
        for group in opt.param_groups:
            group["lr"] = recipe.lr * warm * (0.1 + 0.9 * cosine)
        ids, loss_mask = _demo_batch(task, tok, recipe, rng)
        # Right padding: pad positions sit after each sequence, so causal attention
        # never lets a real token see them; no attention mask is needed.
        logits = model(input_ids=ids).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        weights = loss_mask[:, 1:].reshape(-1)
        loss = (nll * weights).sum() / weights.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if progress is not None:
            progress(step + 1, recipe.steps, float(loss.detach()))
    model.eval()
    return model, tok


def build_default_model(
    dest: Path,
    recipe: WarmStartRecipe = WarmStartRecipe(),
    progress: Callable[[int, int, float], None] | None = None,
) -> Path:
    """Warm-start the embedded model and save it at `dest` atomically."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.time()
    model, tok = warm_start(recipe, progress)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "swarmrl_recipe.json").write_text(
        json.dumps(
            {
                "name": MODEL_NAME,
                "recipe": asdict(recipe),
                "seconds": round(time.time() - start, 1),
            },
            indent=2,
        )
    )
    os.replace(tmp, dest)
    return dest


def cached_model_dir(recipe: WarmStartRecipe, cache_dir: Path | None = None) -> Path:
    """Where the model of `recipe` is cached: named by a digest of the recipe."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    digest = hashlib.sha256(json.dumps(asdict(recipe), sort_keys=True).encode()).hexdigest()[:10]
    return cache_dir / "models" / f"{MODEL_NAME}-{digest}"


def is_cached(recipe: WarmStartRecipe = WarmStartRecipe(), cache_dir: Path | None = None) -> bool:
    """Whether the model of `recipe` is built (its directory is renamed into place whole)."""
    return (cached_model_dir(recipe, cache_dir) / "config.json").exists()


def ensure_default_model(
    cache_dir: Path | None = None,
    recipe: WarmStartRecipe = WarmStartRecipe(),
    progress: Callable[[int, int, float], None] | None = None,
) -> Path:
    """The cached embedded model directory, built on first use (one builder at a time)."""
    dest = cached_model_dir(recipe, cache_dir)
    if (dest / "config.json").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dest / "config.json").exists():
            build_default_model(dest, recipe, progress)
    return dest
