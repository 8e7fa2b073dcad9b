"""Batched, KV-cached sampling that also returns the final-norm hidden states.

Design choices:
- Llama-family models (llama, qwen2, mistral) in single or double precision run on a
  fast path: each distinct prompt prefilled once, a KV cache grown a few slots at a
  time, the model's own weights applied with plain torch ops (``fast_llama.py``), and
  finished sequences dropped from the batch as they end (`transformers.generate` keeps
  computing them). Any other causal LM runs on a generic path through the model's own forward
  with its cache. Both return the same things.
- Randomness is per sample, not per batch: the uniform number that picks token t of a
  sample comes from a counter-based generator keyed by (sample seed, t). A sample's
  text depends only on its seed and its logits, not on batch size or composition, so a
  validator can replay it.
- Token t is drawn by inverse CDF from softmax(logits / temperature) (after top-p when
  top_p < 1). The recorded logprob is log softmax(logits / temperature) of the drawn
  token, the same quantity the trainer computes (top-p truncation is not included).
- The hidden state recorded for token t is the last norm's output at the position whose
  logits drew token t (the LM head's input), kept in bf16: what TOPLOC proofs hash.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from swarmrl.generation.fast_llama import (
    FastLlama,
    fast_decoder,
    left_pad,
    on_device,
    prefill_prompts,
    require_own_forward,
    supports_fast_path,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
GROW_SLOTS = 8  # key/value cache growth per reallocation (see _fast_sample)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    max_new_tokens: int
    eos_token_id: int
    top_p: float = 1.0


@dataclass
class Generation:
    """One sampled completion."""

    tokens: list[int]  # completion token ids, including the EOS if one was drawn
    logprobs: np.ndarray  # float32 [len(tokens)]
    hidden: torch.Tensor | None  # bf16 [len(tokens), hidden] final-norm states
    stopped_on_eos: bool


def uniforms(seeds: np.ndarray, step: int | np.ndarray) -> np.ndarray:
    """Counter-based uniforms in [0, 1): splitmix64 of (seed, step), one per seed (``step``
    may also be an array, broadcast against ``seeds``)."""
    with np.errstate(over="ignore"):
        counter = np.asarray(step, dtype=np.uint64) + np.uint64(1)
        x = seeds.astype(np.uint64) * _GOLDEN + counter * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def draw(
    logits: torch.Tensor, u: np.ndarray, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row by inverse CDF; return (tokens, logprobs under logits/T)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs = logp.exp().double()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        cdf = sorted_p.cumsum(-1)
        target = torch.from_numpy(u).to(cdf.device).unsqueeze(-1) * cdf[:, -1:]
        pick = torch.searchsorted(cdf, target).clamp(max=probs.shape[-1] - 1)
        tokens = order.gather(-1, pick).squeeze(-1)
    else:
        cdf = probs.cumsum(-1)
        target = torch.from_numpy(u).to(cdf.device).unsqueeze(-1) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, target).clamp(max=probs.shape[-1] - 1).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _fast_sample(
    dec: FastLlama,
    prompts: list[list[int]],
    seeds: np.ndarray,
    params: SamplingParams,
    pad_id: int,
    capture_hidden: bool,
) -> list[Generation]:
    """The fast path: each distinct prompt prefilled once, a cache grown in steps, finished rows dropped."""
    n = len(prompts)
    # GRPO samples a prompt G times: prefill each distinct prompt once, then copy its
    # cache rows to every sample of the group.
    pre = prefill_prompts(dec, prompts, pad_id)
    owner, positions, prompt_mask = pre.owner, pre.positions, pre.mask
    width = prompt_mask.shape[1]
    total = width + params.max_new_tokens
    dtype = dec.embed.dtype
    hidden = pre.last[owner]
    # Rotary tables for every decode position, computed once: position p is row p.
    max_pos = int(positions.max()) + 1 + params.max_new_tokens
    rotations = dec.rotary(torch.arange(max_pos).unsqueeze(0), dtype)[0, 0]  # [position, D/2]
    lm_head = dec.lm_head
    # The key/value cache grows GROW_SLOTS slots at a time instead of being allocated at
    # full length: the attention kernel reads each row's filled slots, and keeping rows
    # close together in memory (small gaps) makes those cold reads measurably faster.
    capacity = min(total, width + GROW_SLOTS)
    cache = [
        (_grown(k_pre[owner], width, capacity), _grown(v_pre[owner], width, capacity))
        for k_pre, v_pre in pre.cache
    ]
    key_ok = torch.ones(n, total, dtype=torch.bool)
    key_ok[:, :width] = prompt_mask[owner]
    no_padding = bool(prompt_mask.all())
    next_pos = positions[owner, -1] + 1

    limit = params.max_new_tokens
    # Outputs are written per batch row (plain slice stores, no scatter per step) and
    # moved to their sample's slot when a row leaves the batch or at the end.
    out_tokens = torch.zeros(n, limit, dtype=torch.long)
    out_logp = torch.zeros(n, limit, dtype=torch.float32)
    out_hidden = (
        torch.zeros(n, limit, hidden.shape[-1], dtype=torch.bfloat16) if capture_hidden else None
    )
    row_tokens, row_logp = out_tokens.clone(), out_logp.clone()
    row_hidden = out_hidden.clone() if out_hidden is not None else None
    active = torch.arange(n)  # batch row -> sample index
    finished = torch.zeros(
        n, dtype=torch.bool
    )  # rows that drew EOS; they ride along until compaction
    # Every uniform the loop may need, in one vectorized call: [batch row, step].
    row_u = uniforms(seeds[:, None], np.arange(limit, dtype=np.uint64)[None, :])

    def flush(rows: torch.Tensor) -> None:
        out_tokens[active[rows]] = row_tokens[rows]
        out_logp[active[rows]] = row_logp[rows]
        if row_hidden is not None and out_hidden is not None:
            out_hidden[active[rows]] = row_hidden[rows]

    for step in range(limit):
        logits = F.linear(hidden, *lm_head)
        tok, logp = draw(logits, row_u[:, step], params.temperature, params.top_p)
        row_tokens[:, step] = tok
        row_logp[:, step] = logp
        if row_hidden is not None:
            row_hidden[:, step] = hidden
        finished |= tok == params.eos_token_id
        n_finished = int(finished.sum())
        if step + 1 == limit or n_finished == len(active):
            break
        # Dropping finished rows copies the kept rows' cache (~20 us a row here), while a
        # finished row riding along costs a full row-step (~50 us) every step: drop them
        # once an eighth of the batch has finished (a GRPO group usually finishes
        # together), unless the loop is about to end anyway.
        if n_finished * 8 >= len(active) and limit - step > 3:
            flush(finished.nonzero().squeeze(-1))
            keep = (~finished).nonzero().squeeze(-1)
            active, tok, next_pos = active[keep], tok[keep], next_pos[keep]
            row_tokens, row_logp = row_tokens[keep], row_logp[keep]
            row_hidden = row_hidden[keep] if row_hidden is not None else None
            finished = finished[keep]
            row_u = row_u[keep.cpu().numpy()]
            key_ok = key_ok[keep]
            cache = [(k[keep], v[keep]) for k, v in cache]
        slot = width + step
        if slot == capacity:
            capacity = min(total, capacity + GROW_SLOTS)
            cache = [(_grown(k, slot, capacity), _grown(v, slot, capacity)) for k, v in cache]
        # One query per row sees every filled slot but the prompt's left padding; with
        # no padding at all there is nothing to mask. (A contiguous mask is much
        # faster in the CPU attention kernel than a strided view.)
        step_mask = (
            None
            if no_padding
            else key_ok[:, : slot + 1].contiguous().view(len(active), 1, 1, slot + 1)
        )
        rotary = rotations[next_pos].view(len(active), 1, 1, -1)
        hidden = dec.forward(tok.unsqueeze(-1), rotary, step_mask, cache, slot)[:, -1]
        next_pos = next_pos + 1
    flush(torch.arange(len(active)))
    # A completion ends at its first EOS, or at the limit (or wherever the loop stopped).
    is_eos = out_tokens[:, : step + 1] == params.eos_token_id
    eos = is_eos.any(dim=1)
    lengths = torch.where(eos, is_eos.int().argmax(dim=1) + 1, torch.full((n,), step + 1))
    return _collect(out_tokens, out_logp, out_hidden, lengths, eos)


def _grown(cache: torch.Tensor, filled: int, capacity: int) -> torch.Tensor:
    """A copy of ``cache`` [B, heads, slots, head_dim] with room for ``capacity`` slots."""
    out = torch.empty(*cache.shape[:2], capacity, cache.shape[3], dtype=cache.dtype)
    out[:, :, :filled] = cache[:, :, :filled]
    return out


def _collect(tokens, logp, hidden, lengths, eos) -> list[Generation]:
    out = []
    for i in range(tokens.shape[0]):
        n = int(lengths[i])
        out.append(
            Generation(
                tokens=tokens[i, :n].tolist(),
                logprobs=logp[i, :n].cpu().numpy().copy(),
                hidden=hidden[i, :n].to("cpu", copy=True) if hidden is not None else None,
                stopped_on_eos=bool(eos[i]),
            )
        )
    return out


def _generic_sample(
    model: PreTrainedModel,
    prompts: list[list[int]],
    seeds: np.ndarray,
    params: SamplingParams,
    pad_id: int,
    capture_hidden: bool,
) -> list[Generation]:
    """Any causal LM: its own forward and cache, one step per token, no batch shrinking."""
    from transformers import DynamicCache

    base = model.base_model
    cache_kw = (
        "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    )
    n = len(prompts)
    ids, attn = left_pad(prompts, pad_id)
    positions = (attn.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = base(
        input_ids=ids,
        attention_mask=attn.long(),
        position_ids=positions,
        use_cache=True,
        **{cache_kw: cache},
    )
    hidden = out.last_hidden_state[:, -1]
    next_pos = positions[:, -1:] + 1
    out_tokens = torch.zeros(n, params.max_new_tokens, dtype=torch.long)
    out_logp = torch.zeros(n, params.max_new_tokens, dtype=torch.float32)
    out_hidden = (
        torch.zeros(n, params.max_new_tokens, hidden.shape[-1], dtype=torch.bfloat16)
        if capture_hidden
        else None
    )
    lengths = torch.zeros(n, dtype=torch.long)
    eos = torch.zeros(n, dtype=torch.bool)
    for step in range(params.max_new_tokens):
        tok, logp = draw(
            model.get_output_embeddings()(hidden),
            uniforms(seeds, step),
            params.temperature,
            params.top_p,
        )
        live = ~eos
        out_tokens[live, step] = tok[live]
        out_logp[live, step] = logp[live]
        if out_hidden is not None:
            out_hidden[live, step] = hidden[live].to(torch.bfloat16)
        lengths[live] = step + 1
        eos |= live & (tok == params.eos_token_id)
        if bool(eos.all()) or step + 1 == params.max_new_tokens:
            break
        attn = torch.cat([attn, torch.ones(n, 1, dtype=torch.bool)], dim=1)
        out = base(
            input_ids=tok.unsqueeze(-1),
            attention_mask=attn.long(),
            position_ids=next_pos,
            use_cache=True,
            **{cache_kw: cache},
        )
        hidden = out.last_hidden_state[:, -1]
        next_pos = next_pos + 1
    return _collect(out_tokens, out_logp, out_hidden, lengths, eos)


@torch.inference_mode()
def sample(
    model: PreTrainedModel,
    prompts: list[list[int]],
    seeds: list[int] | np.ndarray,
    params: SamplingParams,
    pad_id: int,
    capture_hidden: bool = True,
    fast: bool | None = None,
) -> list[Generation]:
    """Sample one completion per prompt (repeat a prompt for a group). See module docstring."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    seeds = np.asarray(seeds, dtype=np.uint64)
    if seeds.shape != (len(prompts),):
        raise ValueError(f"need one seed per prompt: {len(prompts)} prompts, {seeds.shape} seeds")
    use_fast = supports_fast_path(model) if fast is None else fast
    with on_device(next(model.parameters()).device):
        if use_fast:
            return _fast_sample(fast_decoder(model), prompts, seeds, params, pad_id, capture_hidden)
        require_own_forward(model, "sample(fast=False)")
        return _generic_sample(model, prompts, seeds, params, pad_id, capture_hidden)
