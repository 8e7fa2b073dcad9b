"""A Llama-family decoder (llama, qwen2, mistral) run over a model's own weights with
plain torch ops and a caller-owned KV cache.

Module attribute lookups and ``__call__`` overhead cost more than the math at the
embedded model's size, so the weights are pulled out once per model (query, key and
value stacked into one matrix) and cached per model object (``fast_decoder``), rebuilt
when an in-place update changes the weights. Each query and key head's rows are
reordered so that rotary embedding is one complex multiplication (``_interleave_qk``);
the cached keys are in that order too, which only this module reads. Gate and up stay
separate: the activation then runs on contiguous tensors, which measured faster than
one stacked product split in two. The ops follow Hugging Face's Llama forward, so
results agree with it to float rounding.

Two users, both starting from ``prefill_prompts`` (each distinct prompt once): the
sampler (``sampler.py``: then one token at a time) and the validator's teacher-forced
prefill (``continuation_states``: then every sample's completion in one pass against its
prompt's cache).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FAST_ARCHITECTURES = {"llama", "qwen2", "mistral"}
_FAST_MODELS: weakref.WeakKeyDictionary[PreTrainedModel, FastLlama] = weakref.WeakKeyDictionary()


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """New tensors default to ``device`` (a GPU) inside this context; on the CPU it is a
    no-op, where the device mode's per-op dispatch would only cost time."""
    return contextlib.nullcontext() if device.type == "cpu" else torch.device(device)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, width] with each prompt flush right, and the mask of real tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = True
    return ids, mask


@dataclass(frozen=True)
class _LayerWeights:
    """One decoder layer's tensors, pulled out of the modules once per model: module
    attribute lookups and `__call__` cost more than the math at this size. The query,
    key and value projections are stacked into one matrix (query and key rows in
    interleaved rotary order)."""

    ln1: torch.Tensor
    ln1_eps: float
    qkv: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    ln2: torch.Tensor
    ln2_eps: float
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]


def _wb(linear: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return linear.weight, linear.bias


def _stacked(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = torch.cat([lin.weight for lin in linears])
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return weight, None
    return weight, torch.cat(
        [
            b
            if b is not None
            else torch.zeros(lin.weight.shape[0], dtype=weight.dtype, device=weight.device)
            for b, lin in zip(biases, linears, strict=True)
        ]
    )


class FastLlama:
    """Static-cache decoder over a Llama-family model's own weights."""

    def __init__(self, model: PreTrainedModel) -> None:
        # No reference to `model` itself: this object is cached per model in a weak
        # dictionary and must not keep its key alive.
        cfg = model.config
        # The Llama-family module tree, read by attribute name (supports_fast_path vets it).
        base: Any = model.model
        self.rotary_emb: Any = base.rotary_emb
        self.n_heads: int = cfg.num_attention_heads
        self.n_kv: int = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim: int = (
            getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        )
        self.lm_head = _wb(model.lm_head)
        self.params = list(model.parameters())
        self.layers = [
            _LayerWeights(
                ln1=layer.input_layernorm.weight,
                ln1_eps=layer.input_layernorm.variance_epsilon,
                qkv=self._interleave_qk(
                    _stacked(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
                ),
                o=_wb(layer.self_attn.o_proj),
                ln2=layer.post_attention_layernorm.weight,
                ln2_eps=layer.post_attention_layernorm.variance_epsilon,
                gate=_wb(layer.mlp.gate_proj),
                up=_wb(layer.mlp.up_proj),
                down=_wb(layer.mlp.down_proj),
            )
            for layer in base.layers
        ]
        self.embed: torch.Tensor = base.embed_tokens.weight
        self.final_norm: tuple[torch.Tensor, float] = (base.norm.weight, base.norm.variance_epsilon)
        self.scale = self.head_dim**-0.5
        self.versions = self._weight_versions()

    def _weight_versions(self) -> tuple[int, ...]:
        # In-place updates (an optimizer step) bump a tensor's version: the stacked
        # copies are then stale and must be rebuilt.
        return tuple(p._version for p in self.params)

    @staticmethod
    def _rms(weight: torch.Tensor, eps: float, x: torch.Tensor) -> torch.Tensor:
        # Same operations, in the same order, as Hugging Face's Llama RMSNorm.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    def _interleave_qk(
        self, qkv: tuple[torch.Tensor, torch.Tensor | None]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Reorder each query and key head's rows from Hugging Face's half-split rotary
        layout (x_0 .. x_{D/2-1}, x_{D/2} .. x_{D-1}) to interleaved pairs
        (x_0, x_{D/2}, x_1, x_{D/2+1}, ...), so that rotary embedding is one complex
        multiplication. Attention scores are dot products of a query and a key with the
        same order, so they do not change; values are not reordered."""
        weight, bias = qkv
        hd = self.head_dim
        pairs = torch.stack(
            [torch.arange(hd // 2), torch.arange(hd // 2) + hd // 2], dim=-1
        ).flatten()
        rows = (torch.arange(self.n_heads + self.n_kv).unsqueeze(1) * hd + pairs).flatten()
        rows = torch.cat([rows, torch.arange(rows.numel(), weight.shape[0])])
        return weight[rows], (bias[rows] if bias is not None else None)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Complex rotations cos + i·sin per position and frequency ([B, 1, T, D/2]), the
        model's own rotary tables (its scaling included) in interleaved form."""
        probe = torch.empty(1, dtype=dtype)
        cos, sin = self.rotary_emb(probe, positions)
        half = cos.shape[-1] // 2
        # Hugging Face's tables repeat each frequency in both halves; one half suffices.
        return torch.complex(cos[..., :half], sin[..., :half]).unsqueeze(1)

    @staticmethod
    def _rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
        # Pair (x_2j, x_2j+1) as one complex number: (a + ib)(cos + i sin) gives
        # a·cos − b·sin and b·cos + a·sin, Hugging Face's rotate-half formula exactly.
        return torch.view_as_real(
            torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rotation
        ).flatten(-2)

    def forward(
        self,
        ids: torch.Tensor,
        rotary: torch.Tensor,
        attn_mask: torch.Tensor | None,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        start: int,
    ) -> torch.Tensor:
        """Run `ids` [B, T] at cache slots start..start+T; return final-norm states [B, T, H]."""
        x = F.embedding(ids, self.embed)
        b, t, _ = x.shape
        end = start + t
        nq, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        gqa = nkv != nq
        for w, (k_cache, v_cache) in zip(self.layers, cache, strict=True):
            h = self._rms(w.ln1, w.ln1_eps, x)
            qkv = F.linear(h, *w.qkv).view(b, t, nq + 2 * nkv, hd).transpose(1, 2)
            qk = self._rope(qkv[:, : nq + nkv], rotary)  # one rotary pass for queries and keys
            k_cache[:, :, start:end] = qk[:, nq:]
            v_cache[:, :, start:end] = qkv[:, nq + nkv :]
            out = F.scaled_dot_product_attention(
                qk[:, :nq],
                k_cache[:, :, :end],
                v_cache[:, :, :end],
                attn_mask=attn_mask,
                scale=self.scale,
                enable_gqa=gqa,
            )
            x = x + F.linear(out.transpose(1, 2).reshape(b, t, -1), *w.o)
            h = self._rms(w.ln2, w.ln2_eps, x)
            x = x + F.linear(F.silu(F.linear(h, *w.gate)) * F.linear(h, *w.up), *w.down)
        return self._rms(*self.final_norm, x)


def supports_fast_path(model: PreTrainedModel) -> bool:
    cfg = model.config
    return (
        cfg.model_type in FAST_ARCHITECTURES
        # The fast path attends to every earlier token: a model with an active sliding
        # window (Mistral's default) takes the generic path.
        and not (getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True))
        and getattr(cfg, "hidden_act", "silu") == "silu"
        # Rotary embedding is a complex multiplication: single or double precision only.
        and model.dtype in (torch.float32, torch.float64)
        and hasattr(model, "model")
        and hasattr(model.model, "rotary_emb")
    )


def require_own_forward(model: PreTrainedModel, what: str) -> None:
    """The generic paths run a transformers model's own forward (its cache classes, its
    masks); a model loaded by ``model/lite.py`` is a Llama-family one, for the fast path."""
    if not hasattr(model, "get_input_embeddings"):
        raise ValueError(
            f"{what}: {type(model).__name__} has no transformers forward to run; "
            "it runs on the fast path (fast=None or True)"
        )


def fast_decoder(model: PreTrainedModel) -> FastLlama:
    """The cached ``FastLlama`` of ``model`` (built on first use, rebuilt after in-place
    weight updates). The caller checks ``supports_fast_path`` first."""
    decoder = _FAST_MODELS.get(model)
    if decoder is None or decoder.versions != decoder._weight_versions():
        decoder = _FAST_MODELS[model] = FastLlama(model)
    return decoder


@dataclass(frozen=True)
class PromptPrefill:
    """Each distinct prompt prefilled once (GRPO samples a prompt G times)."""

    owner: torch.Tensor  # [n] row of each input prompt among the distinct ones
    cache: list[
        tuple[torch.Tensor, torch.Tensor]
    ]  # per layer, keys and values [d, n_kv, width, head_dim]
    last: torch.Tensor  # [d, hidden] final-norm state at each distinct prompt's last token
    mask: torch.Tensor  # [d, width] real tokens (prompts are left-padded to the same width)
    positions: torch.Tensor  # [d, width] position ids


def prefill_prompts(
    decoder: FastLlama, prompts: list[list[int]], pad_id: int, token_budget: int | None = None
) -> PromptPrefill:
    """Prefill every distinct prompt once, in blocks of at most ``token_budget`` padded
    tokens (one block when None)."""
    distinct: dict[tuple[int, ...], int] = {}
    owner = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts])
    ids, mask = left_pad([list(p) for p in distinct], pad_id)
    n_distinct, width = ids.shape
    dtype = decoder.embed.dtype
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    # A pad query row would attend to nothing (NaN); let it see itself. Its output is never used.
    attend = (causal.unsqueeze(0) & mask.unsqueeze(1)) | torch.eye(
        width, dtype=torch.bool
    ).unsqueeze(0)
    shape = (n_distinct, decoder.n_kv, width, decoder.head_dim)
    cache = [
        (torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)) for _ in decoder.layers
    ]
    last = torch.empty(n_distinct, decoder.embed.shape[1], dtype=dtype)
    step = n_distinct if token_budget is None else max(1, token_budget // width)
    for lo in range(0, n_distinct, step):
        hi = min(lo + step, n_distinct)
        block_cache = [(k[lo:hi], v[lo:hi]) for k, v in cache]  # views: forward fills them
        states = decoder.forward(
            ids[lo:hi],
            decoder.rotary(positions[lo:hi], dtype),
            attend[lo:hi].unsqueeze(1),
            block_cache,
            0,
        )
        last[lo:hi] = states[:, -1]
    return PromptPrefill(owner, cache, last, mask, positions)


@torch.inference_mode()
def continuation_states(
    decoder: FastLlama,
    prompts: list[list[int]],
    continuations: list[list[int]],
    *,
    pad_id: int = 0,
    token_budget: int = 8192,
    max_rows: int = 8,
) -> list[torch.Tensor]:
    """Teacher-forced final-norm states, one fp32 ``[len(continuation), hidden]`` per sample.

    Row t of sample i is the state whose logits predict ``continuations[i][t]`` after
    ``prompts[i] + continuations[i][:t]``: the prompt's last position, then continuation
    positions 0 .. len - 2 (the last continuation token is never fed). Each distinct
    prompt is prefilled once (GRPO groups share theirs); then the continuations, sorted
    by length so batches carry little padding, run in one pass per batch against copies
    of their prompt's cache. ``token_budget`` bounds the tokens of one forward pass.
    """
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
    if any(not p for p in prompts) or any(not c for c in continuations):
        raise ValueError("every prompt and every continuation needs at least one token")
    with on_device(decoder.embed.device):
        return _continuation_states(decoder, prompts, continuations, pad_id, token_budget, max_rows)


def _continuation_states(
    decoder: FastLlama,
    prompts: list[list[int]],
    continuations: list[list[int]],
    pad_id: int,
    token_budget: int,
    max_rows: int,
) -> list[torch.Tensor]:
    pre = prefill_prompts(decoder, prompts, pad_id, token_budget)
    owner, prompt_cache, last, prompt_mask = pre.owner, pre.cache, pre.last, pre.mask
    width = prompt_mask.shape[1]
    dtype = decoder.embed.dtype
    next_pos = pre.positions[:, -1] + 1

    fed = [len(c) - 1 for c in continuations]  # tokens fed after the prompt
    results: list[torch.Tensor | None] = [None] * len(prompts)
    for batch in length_batches(fed, token_budget, max_rows):
        rows = torch.tensor(batch)
        owners = owner[rows]
        feed = max(fed[i] for i in batch)
        if feed == 0:
            for row, i in enumerate(batch):
                results[i] = last[owners[row]].unsqueeze(0).float()
            continue
        b = len(batch)
        tokens = torch.full((b, feed), pad_id, dtype=torch.long)
        for row, i in enumerate(batch):
            tokens[row, : fed[i]] = torch.tensor(continuations[i][:-1], dtype=torch.long)
        cache = []
        for k_pre, v_pre in prompt_cache:
            k = torch.empty(b, decoder.n_kv, width + feed, decoder.head_dim, dtype=dtype)
            v = torch.empty_like(k)
            k[:, :, :width] = k_pre[owners]
            v[:, :, :width] = v_pre[owners]
            cache.append((k, v))
        keys = torch.empty(b, feed, width + feed, dtype=torch.bool)
        keys[:, :, :width] = prompt_mask[owners].unsqueeze(1)
        keys[:, :, width:] = torch.ones(feed, feed, dtype=torch.bool).tril()
        pos = next_pos[owners].unsqueeze(1) + torch.arange(feed)
        states = decoder.forward(
            tokens, decoder.rotary(pos, dtype), keys.unsqueeze(1), cache, width
        )
        for row, i in enumerate(batch):
            results[i] = torch.cat([last[owners[row]].unsqueeze(0), states[row, : fed[i]]]).float()
    return results  # type: ignore[return-value]


def length_batches(
    lengths: list[int], token_budget: int, max_rows: int | None = None
) -> list[list[int]]:
    """Indices grouped longest first into batches of at most ``max_rows`` rows whose
    padded size (rows x longest) stays within ``token_budget`` (a longer lone row still
    gets a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        current = batches[-1] if batches else None
        if (
            current is not None
            and (max_rows is None or len(current) < max_rows)
            and lengths[current[0]] * (len(current) + 1) <= token_budget
        ):
            current.append(i)
        else:
            batches.append([i])
    return batches
