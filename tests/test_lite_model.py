"""model/lite.py: Llama-family directories loaded without transformers' model classes
give what transformers gives, and anything it cannot reproduce falls back to transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from swarmrl.checkpoints import load_policy, load_tokenizer
from swarmrl.generation.sampler import SamplingParams, sample, supports_fast_path
from swarmrl.model.lite import (
    LiteCausalLM,
    LiteTokenizer,
    lite_config,
    load_lite_model,
    load_lite_tokenizer,
)
from swarmrl.model.tokenizer import build_char_tokenizer


def _hf(path: Path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _tiny(tmp_path: Path, name: str, config) -> Path:
    """A randomly initialized transformers model of `config`, saved with the char tokenizer."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a wrong mapping shows
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    out = tmp_path / name
    model.save_pretrained(out)
    build_char_tokenizer().save_pretrained(out)
    return out


def _assert_same_model(path: Path) -> LiteCausalLM:
    lite, hf = load_lite_model(path), _hf(path)
    assert isinstance(lite, LiteCausalLM)
    ours, theirs = lite.state_dict(), hf.state_dict()
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    ids = torch.randint(
        4, lite.config.vocab_size, (3, 23), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        torch.testing.assert_close(
            lite(input_ids=ids).logits, hf(input_ids=ids, use_cache=False).logits, rtol=0, atol=1e-5
        )
        positions = torch.arange(40).unsqueeze(0)
        probe = torch.zeros(1)
        for a, b in zip(
            lite.model.rotary_emb(probe, positions),
            hf.model.rotary_emb(probe, positions),
            strict=True,
        ):
            assert torch.equal(a, b)
    # The sampler's fast path over either object draws the same tokens with the same logprobs.
    tok = build_char_tokenizer()  # the ids only (transformers swaps qwen2's tokenizer class)
    params = SamplingParams(temperature=1.0, max_new_tokens=10, eos_token_id=tok.eos_token_id)
    prompts = [tok("347+285 think 41")["input_ids"], tok("5+6 think 32")["input_ids"]]
    assert supports_fast_path(lite) and supports_fast_path(hf)
    a = sample(lite, prompts, [3, 4], params, pad_id=tok.pad_token_id)
    b = sample(hf, prompts, [3, 4], params, pad_id=tok.pad_token_id)
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens
        np.testing.assert_array_equal(x.logprobs, y.logprobs)
    return lite


def test_embedded_model_loads_as_transformers_loads_it(warm_model_dir):
    lite = _assert_same_model(warm_model_dir)
    assert lite.lm_head.weight is lite.model.embed_tokens.weight  # tied, as in the config
    model, tok = load_policy(warm_model_dir)
    assert isinstance(model, LiteCausalLM) and isinstance(tok, LiteTokenizer)


def test_qwen2_and_mistral_with_biases_and_grouped_heads(tmp_path):
    from transformers import MistralConfig, Qwen2Config

    common = {
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
    }
    _assert_same_model(_tiny(tmp_path, "qwen2", Qwen2Config(**common)))
    _assert_same_model(_tiny(tmp_path, "mistral", MistralConfig(sliding_window=None, **common)))


def test_llama_with_biases_and_head_dim(tmp_path):
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=16,  # not hidden_size / heads
        attention_bias=True,
        mlp_bias=True,
        rope_theta=500.0,
        tie_word_embeddings=False,
    )
    _assert_same_model(_tiny(tmp_path, "llama", config))


def test_what_it_cannot_reproduce_loads_through_transformers(tmp_path, warm_model_dir):
    raw = json.loads((warm_model_dir / "config.json").read_text())
    assert lite_config(raw) is not None
    for change in (
        {"model_type": "gpt2"},
        {"hidden_act": "gelu"},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
        {"model_type": "mistral", "sliding_window": 16},
        {"pretraining_tp": 2},
        {"num_attention_heads": "four"},
        {"attention_dropout": 0.1},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"rope_parameters": {"type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
        {"model_type": "mistral", "sliding_window": 4096},
        {"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True},
        "not an object",
    ):
        if isinstance(change, str):
            assert lite_config(change) is None
            continue
        assert lite_config({**raw, **change}) is None, change

    # Defaults that differ between transformers' architectures: left to transformers.
    mistral = {k: v for k, v in raw.items() if k != "sliding_window"}
    assert lite_config({**mistral, "model_type": "mistral"}) is None  # its default window
    no_kv = {k: v for k, v in raw.items() if k != "num_key_value_heads"}
    assert lite_config({**no_kv, "model_type": "qwen2"}) is None

    # A weight file with a tensor the architecture does not have: transformers decides.
    odd = tmp_path / "odd"
    shutil.copytree(warm_model_dir, odd)
    weights = load_file(odd / "model.safetensors")
    weights["model.extra.weight"] = torch.zeros(2)
    save_file(weights, odd / "model.safetensors", metadata={"format": "pt"})
    assert load_lite_model(odd) is None
    model, _ = load_policy(odd)
    assert not isinstance(model, LiteCausalLM)

    # A Hugging Face model outside the Llama family: transformers' model and tokenizer
    # (the lite tokenizer is for llama models only).
    from transformers import GPT2Config

    gpt2 = _tiny(tmp_path, "gpt2", GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2))
    model, tok = load_policy(gpt2)
    assert not isinstance(model, LiteCausalLM) and not isinstance(tok, LiteTokenizer)


def test_tokenizer_matches_transformers(tmp_path, warm_model_dir):
    lite, hf = load_tokenizer(warm_model_dir), AutoTokenizer.from_pretrained(warm_model_dir)
    assert isinstance(lite, LiteTokenizer)
    assert (lite.eos_token_id, lite.pad_token_id, lite.bos_token_id, len(lite)) == (
        hf.eos_token_id,
        hf.pad_token_id,
        hf.bos_token_id,
        len(hf),
    )
    rng = np.random.default_rng(0)
    alphabet = [*list("0123456789+=;() think\n\t€ä<>"), "<eos>", "<pad>", "<bos>", "<unk>"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 30))))
        ids = lite(text)["input_ids"]
        assert ids == hf(text)["input_ids"], text
        for special in (True, False):
            assert lite.encode(text, add_special_tokens=special) == hf.encode(
                text, add_special_tokens=special
            )
        for skip in (True, False):
            assert lite.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            )
    for token in ("7", "<eos>", "(", "never a token"):
        assert lite.convert_tokens_to_ids(token) == hf.convert_tokens_to_ids(token)
    # Written into a checkpoint, its files are the ones read, and transformers reads them.
    out = tmp_path / "tok"
    out.mkdir()
    lite.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (warm_model_dir / name).read_bytes()
    assert AutoTokenizer.from_pretrained(out)("12+3")["input_ids"] == lite("12+3")["input_ids"]


def test_tokenizer_with_settings_of_its_own_loads_through_transformers(tmp_path, warm_model_dir):
    for change in (
        {"tokenizer_class": "LlamaTokenizer"},
        {"add_bos_token": True},
        {"additional_special_tokens": ["<x>"]},
        {"auto_map": {"AutoTokenizer": ["x.Tok", None]}},
    ):
        path = tmp_path / next(iter(change))
        shutil.copytree(warm_model_dir, path)
        config = json.loads((path / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
        assert not isinstance(load_tokenizer(path), LiteTokenizer), change
    # A model type whose tokenizer class transformers replaces (qwen2), and a special
    # tokens file transformers merges: transformers' own tokenizer.
    qwen = tmp_path / "qwen"
    shutil.copytree(warm_model_dir, qwen)
    config = json.loads((qwen / "config.json").read_text())
    (qwen / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    assert load_lite_tokenizer(qwen) is None
    mapped = tmp_path / "mapped"
    shutil.copytree(warm_model_dir, mapped)
    (mapped / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<pad>"}))
    assert load_lite_tokenizer(mapped) is None


def test_tokenizer_json_truncation_and_padding_are_not_applied(tmp_path, warm_model_dir):
    """transformers' plain call neither truncates nor pads, whatever tokenizer.json says."""
    path = tmp_path / "tok"
    shutil.copytree(warm_model_dir, path)
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["truncation"] = {
        "direction": "Right",
        "max_length": 4,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    spec["padding"] = {
        "strategy": {"Fixed": 40},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "<pad>",
    }
    (path / "tokenizer.json").write_text(json.dumps(spec))
    lite, hf = load_lite_tokenizer(path), AutoTokenizer.from_pretrained(path)
    assert lite is not None
    text = "347+285 think 41"
    assert lite(text)["input_ids"] == hf(text)["input_ids"] and len(lite(text)["input_ids"]) == len(
        text
    )


def test_a_qwen2_config_with_its_window_switched_off_takes_the_fast_path(tmp_path):
    """Stock Qwen2.5 configs carry sliding_window 32768 with use_sliding_window false."""
    from transformers import Qwen2Config

    path = _tiny(
        tmp_path,
        "qwen25",
        Qwen2Config(
            vocab_size=100,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        ),
    )
    config = json.loads((path / "config.json").read_text())
    config.update(sliding_window=32768, use_sliding_window=False)
    (path / "config.json").write_text(json.dumps(config))
    model = _assert_same_model(path)
    assert supports_fast_path(model) and model.name_or_path == str(path)


def test_sampling_roles_start_without_transformers(warm_model_dir):
    """Workers, the validator, the trainer and the evaluation import and load a policy,
    and `swarmrl run` checks `--model.path`, without transformers (seconds of CPU per
    process at a run's start)."""
    code = (
        "import sys\n"
        "import swarmrl.commands.roles, swarmrl.inference.worker, swarmrl.validator.service\n"
        "import swarmrl.trainer.trainer\n"
        "import swarmrl.evaluation\n"
        "from swarmrl.checkpoints import load_policy\n"
        "from swarmrl.run.launch import check_model_dir\n"
        "load_policy(sys.argv[1])\n"
        "check_model_dir(__import__('pathlib').Path(sys.argv[1]))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('transformers', 'torch._dynamo'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(warm_model_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def _grads(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, use_cache=False).logits
    torch.log_softmax(logits, -1)[..., 5].sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_trains_and_saves_as_transformers_does(tmp_path, warm_model_dir):
    """The trainer's use: the same gradients (with and without activation checkpointing),
    and a written checkpoint that transformers loads with the same weights."""
    lite, hf = load_lite_model(warm_model_dir), _hf(warm_model_dir)
    ids = torch.randint(4, 100, (4, 30), generator=torch.Generator().manual_seed(2))
    ours, theirs = _grads(lite, ids), _grads(hf, ids)
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-6)
    lite.gradient_checkpointing_enable()
    for name, grad in _grads(lite, ids).items():
        torch.testing.assert_close(grad, ours[name], rtol=0, atol=1e-6)

    with torch.no_grad():
        for p in lite.parameters():
            p.add_(0.01)
    out = tmp_path / "saved"
    out.mkdir()
    lite.save_pretrained(out)
    again = _hf(out)
    mine = lite.state_dict()
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, mine[name]), name
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    assert (out / "generation_config.json").read_bytes() == (
        warm_model_dir / "generation_config.json"
    ).read_bytes()
    assert load_lite_model(out) is not None


def test_generic_paths_refuse_a_lite_model_with_a_clear_error(warm_model_dir):
    from swarmrl.validator.prefill import recompute

    model, tok = load_policy(warm_model_dir)
    params = SamplingParams(temperature=1.0, max_new_tokens=4, eos_token_id=tok.eos_token_id)
    with pytest.raises(ValueError, match="fast path"):
        sample(model, [[5, 6]], [1], params, pad_id=0, fast=False)
    with pytest.raises(ValueError, match="fast path"):
        recompute(model, [[5, 6]], [[7]], temperature=1.0, top_p=1.0, eos_id=2, fast=False)
