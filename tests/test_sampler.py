"""The sampling loop: fast path equals the model's own forward, per-sample determinism."""

import numpy as np
import pytest
import torch

from helpers import random_model
from swarmrl.checkpoints import load_policy
from swarmrl.generation.sampler import SamplingParams, draw, sample, uniforms

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19], [20]]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fast_path_matches_generic_path_and_full_forward(kind):
    model, tok = random_model(kind)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, eos_token_id=tok.eos_token_id)
    prompts, seeds = PROMPTS * 3, list(range(12))
    fast = sample(model, prompts, seeds, params, pad_id=0, fast=True)
    slow = sample(model, prompts, seeds, params, pad_id=0, fast=False)
    for a, b, prompt in zip(fast, slow, prompts, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        # The recorded hidden rows are the final-norm states that produced each token:
        # one prefill of prompt + completion reproduces them and the logprobs.
        with torch.no_grad():
            full = model.model(input_ids=torch.tensor([prompt + a.tokens])).last_hidden_state[0]
            rows = full[len(prompt) - 1 : len(prompt) - 1 + len(a.tokens)]
            lp = torch.log_softmax(model.lm_head(rows), -1).gather(
                -1, torch.tensor(a.tokens)[:, None]
            )[:, 0]
        assert torch.allclose(rows.bfloat16().float(), a.hidden.float(), atol=2e-2)
        np.testing.assert_allclose(lp.numpy(), a.logprobs, atol=1e-4)


def test_samples_do_not_depend_on_batch_composition():
    model, tok = random_model()
    params = SamplingParams(temperature=0.8, max_new_tokens=16, eos_token_id=tok.eos_token_id)
    alone = sample(model, [PROMPTS[2]], [42], params, pad_id=0)[0]
    crowd = sample(
        model, [*PROMPTS, PROMPTS[2], *PROMPTS], [1, 2, 3, 4, 42, 5, 6, 7, 8], params, pad_id=0
    )[4]
    assert alone.tokens == crowd.tokens


@pytest.mark.slow  # builds a warm-started model (about 150 training steps)
def test_finished_sequences_stop_and_record_eos(warm_model_dir):
    model, tok = load_policy(warm_model_dir)
    params = SamplingParams(temperature=0.6, max_new_tokens=60, eos_token_id=tok.eos_token_id)
    prompt = tok("123+456 think 32\n")["input_ids"]
    gens = sample(model, [prompt] * 16, list(range(16)), params, pad_id=tok.pad_token_id)
    ended = [g for g in gens if g.stopped_on_eos]
    assert ended, "a warm-started model ends some completions"
    for g in gens:
        assert len(g.tokens) == len(g.logprobs) == g.hidden.shape[0]
        assert (g.tokens[-1] == tok.eos_token_id) == g.stopped_on_eos
        assert tok.eos_token_id not in g.tokens[:-1]
        assert np.all(g.logprobs <= 0)


@pytest.mark.slow  # builds a warm-started model (about 150 training steps)
def test_rows_leaving_the_batch_and_cache_growth_change_nothing(warm_model_dir):
    """The fast path drops finished rows mid-loop and grows its cache in steps; each
    sample must still equal the generic path's (which does neither: transformers' own
    forward, so the model is loaded through transformers)."""
    from transformers import AutoModelForCausalLM

    _, tok = load_policy(warm_model_dir)
    model = AutoModelForCausalLM.from_pretrained(warm_model_dir, dtype=torch.float32).eval()
    params = SamplingParams(temperature=0.6, max_new_tokens=48, eos_token_id=tok.eos_token_id)
    prompts = [
        tok(f"{a}+{b} think {t}\n")["input_ids"]
        for a, b, t in ((12, 7, 8), (345, 678, 40), (9, 9, 16), (1234, 56, 32))
    ]
    prompts, seeds = [p for p in prompts for _ in range(6)], list(range(24))
    fast = sample(model, prompts, seeds, params, pad_id=tok.pad_token_id, fast=True)
    slow = sample(model, prompts, seeds, params, pad_id=tok.pad_token_id, fast=False)
    lengths = [len(g.tokens) for g in fast]
    # For this test to mean anything, an eighth of the rows must end at least 4 steps
    # before the last one (the fast path then drops them) and the cache must grow.
    assert sum(n <= max(lengths) - 4 for n in lengths) * 8 >= len(lengths), sorted(lengths)
    for a, b in zip(fast, slow, strict=True):
        assert a.tokens == b.tokens and a.stopped_on_eos == b.stopped_on_eos
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
        assert torch.allclose(a.hidden.float(), b.hidden.float(), atol=2e-2)


def test_uniforms_and_draw():
    u = uniforms(np.array([1, 2, 3], dtype=np.uint64), 0)
    assert u.shape == (3,) and np.all((u >= 0) & (u < 1))
    assert np.array_equal(u, uniforms(np.array([1, 2, 3], dtype=np.uint64), 0))
    assert not np.array_equal(u, uniforms(np.array([1, 2, 3], dtype=np.uint64), 1))
    # Steps broadcast: one seed's uniforms for many steps equal the per-step calls.
    one = np.full(5, 2**63 + 11, dtype=np.uint64)
    assert np.array_equal(uniforms(one, np.arange(5)), [uniforms(one[:1], t)[0] for t in range(5)])
    # Inverse CDF: probabilities [0.25, 0.75]: u < 0.25 picks 0, otherwise 1.
    logits = torch.log(torch.tensor([[0.25, 0.75], [0.25, 0.75]]))
    tokens, logp = draw(logits, np.array([0.2, 0.3]), temperature=1.0, top_p=1.0)
    assert tokens.tolist() == [0, 1]
    np.testing.assert_allclose(logp.numpy(), np.log([0.25, 0.75]), rtol=1e-6)
    # top-p 0.5 keeps only the 0.75 token.
    tokens, _ = draw(logits, np.array([0.01, 0.99]), temperature=1.0, top_p=0.5)
    assert tokens.tolist() == [1, 1]
    # Empirical frequencies follow the distribution.
    many = uniforms(np.arange(20000, dtype=np.uint64), 3)
    tokens, _ = draw(logits[:1].expand(20000, 2), many, temperature=1.0, top_p=1.0)
    assert abs(tokens.float().mean().item() - 0.75) < 0.015


def test_any_causal_lm_runs_on_the_generic_path(tmp_path):
    """A non-Llama architecture (GPT-2) samples through its own forward, and the recorded
    hidden rows and logprobs match one prefill of prompt + completion."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from swarmrl.generation.sampler import supports_fast_path
    from swarmrl.model.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tok),
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=128,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    ).eval()
    model.save_pretrained(tmp_path / "gpt2")
    tok.save_pretrained(tmp_path / "gpt2")
    model, tok = load_policy(tmp_path / "gpt2")
    assert not supports_fast_path(model)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, eos_token_id=tok.eos_token_id)
    prompts = [tok("12+34 think 32\n")["input_ids"], tok("5+6\n")["input_ids"]]
    gens = sample(model, prompts, [3, 4], params, pad_id=tok.pad_token_id)
    for prompt, gen in zip(prompts, gens, strict=True):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt + gen.tokens]), output_hidden_states=True)
        rows = slice(len(prompt) - 1, len(prompt) - 1 + len(gen.tokens))
        lp = torch.log_softmax(out.logits[0, rows], -1).gather(
            -1, torch.tensor(gen.tokens)[:, None]
        )[:, 0]
        np.testing.assert_allclose(lp.numpy(), gen.logprobs, atol=1e-4)
        assert torch.allclose(
            out.hidden_states[-1][0, rows].bfloat16().float(), gen.hidden.float(), atol=2e-2
        )


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_teacher_forced_states_match_the_models_own_forward(kind):
    """The validator's prefill (each distinct prompt once, completions batched by length)
    gives, per completion token, the final-norm state of one full forward."""
    from swarmrl.generation.fast_llama import continuation_states, fast_decoder

    model, _ = random_model(kind)
    prompts = [PROMPTS[0]] * 3 + [PROMPTS[1]] * 2 + [PROMPTS[3]]
    completions = [
        [30, 31, 32, 33],
        [34],
        [35, 36, 37, 38, 39, 40, 41],
        [42, 43],
        [44, 45, 46],
        [47, 48],
    ]
    states = continuation_states(
        fast_decoder(model), prompts, completions, max_rows=2, token_budget=8
    )
    for prompt, completion, got in zip(prompts, completions, states, strict=True):
        with torch.no_grad():
            full = model.model(
                input_ids=torch.tensor([prompt + completion[:-1]])
            ).last_hidden_state[0]
        want = full[len(prompt) - 1 :]
        assert got.shape == (len(completion), model.config.hidden_size)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="at least one token"):
        continuation_states(fast_decoder(model), [[5]], [[]])
