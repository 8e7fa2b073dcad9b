"""Llama-family model directories loaded with plain torch, safetensors and tokenizers.

Why: importing transformers' model classes costs 2-3 CPU-seconds per process (about 4
with its tokenizer classes), and a run starts the trainer, the workers, the validator and
the evaluation on two cores at once. Sampling and prefill go through
``generation.fast_llama``, which reads the weights by their Hugging Face module names;
this module builds that module tree from ``config.json`` and the safetensors files, with
the same parameter names, so ``state_dict()`` and every reader of it see a Hugging Face
checkpoint's layout, and the trainer trains it and writes it back (``save_pretrained``)
as a Hugging Face model directory.

It takes only what it can reproduce exactly; anything else is ``None`` and the caller
loads through transformers (``checkpoints.load_policy``):
- models: ``llama``, ``qwen2`` and ``mistral`` without an active sliding window, SiLU,
  default rotary embedding (no scaling), weights in one safetensors file or an index of
  shards whose names are exactly the expected ones; computed in float32, as
  ``load_policy`` loads any model;
- tokenizers: a llama model's ``tokenizer.json`` whose ``tokenizer_config.json`` names
  the generic fast tokenizer class (``TokenizersBackend`` or ``PreTrainedTokenizerFast``)
  and no setting or special token of its own, which transformers runs through the same
  ``tokenizers`` object with nothing added.

``forward`` follows Hugging Face's Llama forward op for op (a causal pass over
right-padded ids; ``tests/test_lite_model.py`` compares the two).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from swarmrl.generation.fast_llama import FAST_ARCHITECTURES

GENERIC_TOKENIZERS = {"TokenizersBackend", "PreTrainedTokenizerFast"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class LiteConfig:
    """The fields of a Llama-family ``config.json`` the decoder needs, under their
    Hugging Face names (``fast_llama`` and the validator read them off ``model.config``)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    hidden_act: str = "silu"
    sliding_window: int | None = None
    max_position_embeddings: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None


def lite_config(raw: Any) -> LiteConfig | None:
    """The config of ``raw`` (a parsed config.json), or None when this module cannot
    reproduce transformers' model for it exactly."""
    if not isinstance(raw, dict):
        return None
    model_type = raw.get("model_type")
    if model_type not in FAST_ARCHITECTURES:
        return None
    if raw.get("hidden_act", "silu") != "silu" or raw.get("pretraining_tp", 1) != 1:
        return None
    if raw.get("attention_dropout", 0.0):  # transformers applies it in training
        return None
    # A window transformers would apply: Mistral's whenever one is set (its default,
    # 4096, when the key is absent), Qwen2's when use_sliding_window says so.
    if model_type == "mistral" and ("sliding_window" not in raw or raw["sliding_window"]):
        return None
    if raw.get("sliding_window") and raw.get("use_sliding_window", False):
        return None
    # Transformers' defaults for an absent head count differ by architecture.
    if model_type != "llama" and "num_key_value_heads" not in raw:
        return None
    if raw.get("rope_scaling"):  # transformers prefers it to rope_parameters
        return None
    theta: Any
    rope = raw.get("rope_parameters")
    if rope is not None:
        if not isinstance(rope, dict):
            return None
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            return None
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
    else:
        theta = raw.get("rope_theta", 10000.0)
    try:
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        # Mistral's layers have no biases whatever the config says.
        attention_bias = bool(raw.get("attention_bias", False)) and model_type == "llama"
        return LiteConfig(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has query, key and value biases and no output bias.
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)) if model_type == "llama" else False,
            sliding_window=None,  # an active window was refused above
            max_position_embeddings=raw.get("max_position_embeddings"),
            eos_token_id=raw.get("eos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
            bos_token_id=raw.get("bos_token_id"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _unset(*shape: int) -> nn.Parameter:
    # A placeholder the loaded tensor replaces (load_state_dict(assign=True)). Made on
    # the meta device with no initializer: torch's initializers on meta tensors import
    # its compiler, seconds of CPU.
    return nn.Parameter(torch.empty(shape, device="meta"))


class Linear(nn.Module):
    """``nn.Linear`` without its initialization; same parameter names."""

    def __init__(self, fan_in: int, fan_out: int, bias: bool) -> None:
        super().__init__()
        self.weight = _unset(fan_out, fan_in)
        self.bias = _unset(fan_out) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, count: int, size: int) -> None:
        super().__init__()
        self.weight = _unset(count, size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


def _linear(fan_in: int, fan_out: int, bias: bool) -> Linear:
    return Linear(fan_in, fan_out, bias)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = _unset(size)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Hugging Face's order of operations: normalize in float32, scale in x's dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * xf.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """The default rotary tables, computed as Hugging Face computes them."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LiteConfig) -> None:
        super().__init__()
        hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = _linear(cfg.hidden_size, nq * hd, cfg.qkv_bias)
        self.k_proj = _linear(cfg.hidden_size, nkv * hd, cfg.qkv_bias)
        self.v_proj = _linear(cfg.hidden_size, nkv * hd, cfg.qkv_bias)
        self.o_proj = _linear(nq * hd, cfg.hidden_size, cfg.o_bias)
        self.shape = (nq, nkv, hd)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        nq, nkv, hd = self.shape
        q = self.q_proj(x).view(b, t, nq, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, nkv, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, nkv, hd).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=hd**-0.5, enable_gqa=nkv != nq
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class MLP(nn.Module):
    def __init__(self, cfg: LiteConfig) -> None:
        super().__init__()
        self.gate_proj = _linear(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.up_proj = _linear(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.down_proj = _linear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LiteConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: LiteConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.checkpointing = False

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        cos, sin = self.rotary_emb(x, positions)
        recompute = self.checkpointing and self.training and torch.is_grad_enabled()
        if recompute:
            from torch.utils.checkpoint import checkpoint
        for layer in self.layers:
            # Non-reentrant checkpointing composes with FSDP2's hooks.
            x = (
                checkpoint(layer, x, cos, sin, use_reentrant=False)
                if recompute
                else layer(x, cos, sin)
            )
        return self.norm(x)


@dataclass(frozen=True)
class LiteOutput:
    logits: torch.Tensor


class LiteCausalLM(nn.Module):
    """A Llama-family causal LM under Hugging Face's module and parameter names."""

    # What the sharded trainer reads off a transformers model, under the same names.
    _no_split_modules = ("DecoderLayer",)
    supports_gradient_checkpointing = True

    def __init__(self, cfg: LiteConfig, files: dict[str, bytes] | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.model = Decoder(cfg)
        self.lm_head = _linear(cfg.hidden_size, cfg.vocab_size, False)
        # config.json and generation_config.json as read: a checkpoint carries them on.
        self._files = files or {}
        self.name_or_path: str = ""  # the directory it was loaded from

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def base_model(self) -> Decoder:
        return self.model

    def get_output_embeddings(self) -> Linear:
        return self.lm_head

    def forward(
        self, input_ids: torch.Tensor, attention_mask: None = None, use_cache: bool = False
    ) -> LiteOutput:
        """Logits of a causal pass over ``input_ids`` [B, T]. No attention mask: pad on
        the right, where no real token attends to a pad."""
        if attention_mask is not None:
            raise ValueError("LiteCausalLM takes right-padded ids and no attention mask")
        return LiteOutput(self.lm_head(self.model(input_ids)))

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: Any = None) -> None:
        """Recompute each decoder layer's activations in the backward pass (always the
        non-reentrant kind)."""
        self.model.checkpointing = True

    def save_pretrained(
        self, dest: Path, state_dict: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Write a Hugging Face model directory: the config as read, in float32 (the
        weights' dtype here), and ``model.safetensors`` (a tied output head once, under
        the embedding's name, as transformers writes it)."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        weights = dict(self.state_dict() if state_dict is None else state_dict)
        if self.config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        save_file(
            {name: t.detach().contiguous() for name, t in weights.items()},
            dest / "model.safetensors",
            metadata={"format": "pt"},
        )
        config = json.loads(self._files["config.json"])
        for key in ("dtype", "torch_dtype"):
            if key in config:
                config[key] = "float32"
        config.setdefault("dtype", "float32")
        (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if "generation_config.json" in self._files:
            (dest / "generation_config.json").write_bytes(self._files["generation_config.json"])


def expected_names(cfg: LiteConfig) -> set[str]:
    """The tensor names a checkpoint of ``cfg`` holds (the output head only when untied)."""
    meta = LiteCausalLM(cfg)
    names = {name for name, _ in meta.named_parameters(remove_duplicate=False)}
    if cfg.tie_word_embeddings:
        names.discard("lm_head.weight")
    return names


def _weight_files(path: Path) -> list[Path] | None:
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return None
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    files = [path / name for name in shards if isinstance(name, str)]
    if len(files) != len(shards) or not all(f.is_file() and f.parent == path for f in files):
        return None
    return files


def load_lite_model(path: Path) -> LiteCausalLM | None:
    """The model of directory ``path`` in float32 eval mode, or None when this module
    does not reproduce it exactly (then load it through transformers)."""
    path = Path(path)
    kept = {
        name: (path / name).read_bytes()
        for name in ("config.json", "generation_config.json")
        if (path / name).is_file()
    }
    try:
        cfg = lite_config(json.loads(kept["config.json"]))
    except (KeyError, ValueError):
        return None  # transformers then says what is wrong with it
    files = _weight_files(path)
    if cfg is None or files is None:
        return None
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    if set(weights) != expected_names(cfg):
        return None
    if any(not t.is_floating_point() for t in weights.values()):
        return None
    model = LiteCausalLM(cfg, kept)
    try:
        model.load_state_dict(
            {name: t.float() for name, t in weights.items()}, strict=False, assign=True
        )
    except RuntimeError:  # a tensor of another shape than the config gives
        return None
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.name_or_path = str(path)  # as transformers' models say it: the vLLM engine reads it
    return model.eval()


def _special(config: dict[str, Any], key: str) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class LiteTokenizer:
    """The parts of a Hugging Face fast tokenizer that swarmrl uses, over the same
    ``tokenizers`` object: ``tok(text)["input_ids"]``, ``decode``, the special ids."""

    def __init__(self, files: dict[str, bytes], core: Any, specials: dict[str, int | None]) -> None:
        # The files' bytes, not their folder: a checkpoint the tokenizer came from may be
        # pruned while the trainer still writes new ones with it.
        self._files = files
        self._core = core
        self.eos_token_id = specials["eos_token"]
        self.bos_token_id = specials["bos_token"]
        self.unk_token_id = specials["unk_token"]
        # load_policy's rule for a tokenizer without one: pad with the end token.
        pad = specials["pad_token"]
        self.pad_token_id = pad if pad is not None else self.eos_token_id

    def __len__(self) -> int:
        return self._core.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._core.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The token's id; an unknown one maps to the unknown token's (None without one)."""
        found = self._core.token_to_id(token)
        return found if found is not None else self.unk_token_id

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._core.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save_pretrained(self, dest: Path) -> None:
        """Write the tokenizer's files as they were read (a checkpoint carries them unchanged)."""
        Path(dest).mkdir(parents=True, exist_ok=True)
        for name, data in self._files.items():
            (Path(dest) / name).write_bytes(data)


def load_lite_tokenizer(path: Path) -> LiteTokenizer | None:
    """The tokenizer of directory ``path``, or None when transformers would add anything
    of its own to the ``tokenizers`` object (then load it through transformers)."""
    from tokenizers import Tokenizer

    path = Path(path)
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not (path / "tokenizer.json").is_file():
        return None
    if config.get("tokenizer_class") not in GENERIC_TOKENIZERS:
        return None
    # AutoTokenizer swaps the declared class for its own for some model types (qwen2,
    # phi3, ...) and has special routes for others; the generic class is kept as
    # declared for llama.
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    if model_type != "llama":
        return None
    # Settings and special tokens transformers applies on top of the tokenizers object.
    if config.get("clean_up_tokenization_spaces") or any(
        key in config
        for key in (
            "add_bos_token",
            "add_eos_token",
            "add_prefix_space",
            "auto_map",
            "added_tokens_decoder",
            "additional_special_tokens",
            "extra_special_tokens",
        )
    ):
        return None
    if (path / "special_tokens_map.json").exists():
        return None
    files = {
        name: (path / name).read_bytes() for name in TOKENIZER_FILES if (path / name).is_file()
    }
    core = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    # A plain call in transformers neither truncates nor pads.
    core.no_truncation()
    core.no_padding()
    special_ids = {i for i, t in core.get_added_tokens_decoder().items() if t.special}
    specials: dict[str, int | None] = {}
    for key in ("eos_token", "bos_token", "pad_token", "unk_token"):
        name = _special(config, key)
        specials[key] = core.token_to_id(name) if name is not None else None
        # Transformers makes each named one a special token (skipped by decode).
        if name is not None and specials[key] not in special_ids:
            return None
    if specials["eos_token"] is None:
        return None
    return LiteTokenizer(files, core, specials)
