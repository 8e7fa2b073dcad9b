"""Recompute, with one batched prefill of the claimed policy, what each sampled token saw.

For every sample the validator feeds prompt + completion (all but the last completion
token) through the claimed model and keeps, for each completion token t, the row whose
logits drew t. Llama-family models run on the fast decoder the sampler uses
(``generation.fast_llama``): each distinct prompt is prefilled once (a GRPO group shares
it), then every completion in one pass against a copy of its prompt's cache, batched
by length. Other models run their own Hugging Face forward over right-padded
prompt + completion. Per token it computes:

- the final-norm hidden state in bf16 (what the TOPLOC proof hashes);
- under the sampling distribution softmax(logits / T) (top-p truncated when top_p < 1,
  exactly as ``swarmrl.generation.sampler.draw`` builds it): the token's log-probability
  (the quantity the worker reports), the probability of EOS, the token's CDF interval in
  the sampler's inverse-CDF order (for replay), the capped surprisal min(-log q(x), C) with
  its exact mean and variance under q (C = ``SURPRISAL_CAP``), and the
  probability-integral transform, used by the statistical tests (``sampling``).

The sampler and this prefill apply the same weights with the same fp32 ops, but over
different shapes (one token at a time there, whole completions here), so matrix
products round differently; docs/validator.md gives the measured disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from swarmrl.generation.fast_llama import (
    continuation_states,
    fast_decoder,
    length_batches,
    require_own_forward,
    supports_fast_path,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Elements of one float64 [rows, vocab] statistics array (128 MiB).
_STATS_ELEMENTS = 1 << 24
# Floor for a probability whose log is taken: a token outside the top-p nucleus has
# probability 0 under the sampling distribution; its surprisal is then large, not inf.
_TINY = 1e-300
# The surprisal test works on min(-log q(x), C): an honest worker does now and then draw a
# token of probability 1e-12, whose raw surprisal (27.6) would dominate a whole file's sum
# and make it heavy-tailed. Capped, every token moves the sum by at most C, which is what
# lets the test bound its false rejects without assuming normality (sampling.py). Any
# token below e^-C (4.5e-5) still counts fully as "unlikely".
SURPRISAL_CAP = 10.0


@dataclass
class TokenStats:
    """Per completion token of one sample, as recomputed by the validator."""

    hidden: torch.Tensor  # bf16 [n, hidden]
    logprobs: (
        np.ndarray
    )  # float64 [n]: log softmax(logits / T) of the token (untruncated, as the worker records)
    eos_probs: np.ndarray  # float64 [n]: probability of EOS under the sampling distribution
    cdf_low: np.ndarray  # float64 [n]: the token's CDF interval in the sampler's order, normalized
    cdf_high: np.ndarray  # float64 [n]
    surprisal: (
        np.ndarray
    )  # float64 [n]: min(-log q(token), SURPRISAL_CAP), q = the sampling distribution
    surprisal_mean: np.ndarray  # float64 [n]: E_q[min(-log q, SURPRISAL_CAP)]
    surprisal_var: np.ndarray  # float64 [n]: Var_q[min(-log q, SURPRISAL_CAP)]
    rank_low: np.ndarray  # float64 [n]: q-mass of tokens more likely than this one
    prob: np.ndarray  # float64 [n]: q(token)


def _distribution_stats(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float, eos_id: int
) -> dict[str, np.ndarray]:
    """Per row: the token's statistics under the sampler's distribution (see module docstring)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    token_logp = logp.gather(-1, tokens[:, None]).squeeze(-1).double()
    probs = logp.exp().double()
    rows = torch.arange(len(tokens))
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < top_p
        kept = torch.zeros_like(probs).scatter(-1, order, (sorted_p * keep_sorted))
        cdf = (sorted_p * keep_sorted).cumsum(-1)
        total = cdf[:, -1]
        where = (order == tokens[:, None]).nonzero()[:, 1]
        high = cdf[rows, where]
        low = high - kept[rows, tokens]
        # A token outside the nucleus cannot be drawn: give it an interval no uniform reaches.
        outside = kept[rows, tokens] == 0
        low = torch.where(outside, 2.0 * total, low)
        high = torch.where(outside, 2.0 * total, high)
        q = kept / total[:, None]
    else:
        cdf = probs.cumsum(-1)
        total = cdf[:, -1]
        high = cdf[rows, tokens]
        low = high - probs[rows, tokens]
        q = probs / total[:, None]
    capped = (-q.clamp(min=_TINY).log()).clamp(max=SURPRISAL_CAP)
    mean = (q * capped).sum(-1)
    second = (q * capped * capped).sum(-1)
    q_tok = q[rows, tokens]
    rank_low = (q * (q > q_tok[:, None])).sum(-1)
    return {
        "logprobs": token_logp.numpy(),
        "eos_probs": q[:, eos_id].numpy(),
        "cdf_low": (low / total).numpy(),
        "cdf_high": (high / total).numpy(),
        "surprisal": capped[rows, tokens].numpy(),
        "surprisal_mean": mean.numpy(),
        "surprisal_var": (second - mean * mean).clamp(min=0).numpy(),
        "rank_low": rank_low.numpy(),
        "prob": q_tok.numpy(),
    }


@torch.inference_mode()
def recompute(
    model: PreTrainedModel,
    prompts: list[list[int]],
    completions: list[list[int]],
    *,
    temperature: float,
    top_p: float,
    eos_id: int,
    token_budget: int = 8192,
    fast: bool | None = None,
) -> list[TokenStats]:
    """One ``TokenStats`` per sample; prompts and completions must be non-empty and in the vocabulary.

    Llama-family models take the fast decoder (``generation.fast_llama``: each distinct
    prompt prefilled once, completions batched by length); others, or ``fast=False``,
    their own Hugging Face forward over right-padded prompt + completion.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    use_fast = supports_fast_path(model) if fast is None else fast
    if use_fast:
        states = continuation_states(
            fast_decoder(model), prompts, completions, token_budget=token_budget
        )
    else:
        require_own_forward(model, "recompute(fast=False)")
        states = _forward_states(model, prompts, completions, token_budget)
    head = model.get_output_embeddings()
    flat = torch.cat(states)
    tokens = torch.cat([torch.tensor(c, dtype=torch.long) for c in completions])
    # The statistics hold a few float64 [rows, vocab] arrays: bound the rows per pass.
    rows = max(1, _STATS_ELEMENTS // head.weight.shape[0])
    parts = [
        _distribution_stats(
            head(flat[i : i + rows]), tokens[i : i + rows], temperature, top_p, eos_id
        )
        for i in range(0, len(tokens), rows)
    ]
    stats = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    bf16 = flat.to(torch.bfloat16)
    results, start = [], 0
    for completion in completions:
        end = start + len(completion)
        results.append(
            TokenStats(
                hidden=bf16[start:end].clone(), **{k: v[start:end] for k, v in stats.items()}
            )
        )
        start = end
    return results


def _forward_states(
    model: PreTrainedModel,
    prompts: list[list[int]],
    completions: list[list[int]],
    token_budget: int,
) -> list[torch.Tensor]:
    """Per sample, the final-norm states that drew each completion token (fp32), from the
    model's own forward over right-padded prompt + completion batches of similar length."""
    lengths = [len(p) + len(c) - 1 for p, c in zip(prompts, completions, strict=True)]
    base = model.base_model
    results: list[torch.Tensor | None] = [None] * len(prompts)
    for batch in length_batches(lengths, token_budget):
        width = max(lengths[i] for i in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, i in enumerate(batch):
            seq = prompts[i] + completions[i][:-1]
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state
        # Completion token t was drawn from the logits at position len(prompt) - 1 + t.
        for row, i in enumerate(batch):
            first = len(prompts[i]) - 1
            results[i] = hidden[row, first : first + len(completions[i])].float()
    return results  # type: ignore[return-value]
