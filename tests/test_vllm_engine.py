"""The vLLM engine (``inference.engine = "vllm"``) draws exactly what the validator replays.

Runs only where vLLM imports (the vLLM venv, docs/architecture.md); elsewhere every test
is skipped with the reason. One engine on the embedded model serves the module: it
generates a few GRPO groups, and each sample must be the native loop's sample token for
token, replay without a miss in the validator's prefill, report the validator's
logprobs and carry TOPLOC proofs the validator accepts. A policy swapped into the
running engine must change what it samples, to what the native loop samples from it.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from helpers import vllm_only
from swarmrl.checkpoints import load_policy
from swarmrl.generation.sampler import SamplingParams, sample
from swarmrl.toploc import bytes_to_proofs, proof_column
from swarmrl.validator.checks import check_toploc
from swarmrl.validator.prefill import recompute
from swarmrl.validator.sampling import replay
from swarmrl.validator.settings import ValidatorSettings

pytestmark = [pytest.mark.slow, vllm_only()]

PROMPTS = [[1, 5, 6, 77, 5, 85], [1, 7, 7, 77, 8, 85, 9], [1, 9, 77, 9, 85]]
GROUP = 4


@pytest.fixture(scope="module")
def engine_and_policy():
    from swarmrl.generation.vllm_engine import VllmEngine
    from swarmrl.model.build import ensure_default_model

    torch.set_num_threads(1)
    path = ensure_default_model()
    model, tok = load_policy(path)
    return VllmEngine(path), model, tok


def _requests():
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    seeds = [1000 + 17 * i for i in range(len(prompts))]
    return prompts, seeds


def _params(tok, temperature: float = 0.6) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_new_tokens=48, eos_token_id=tok.eos_token_id)


def test_engine_samples_what_the_validator_replays(engine_and_policy) -> None:
    engine, model, tok = engine_and_policy
    prompts, seeds = _requests()
    params = _params(tok)
    drawn = engine.sample(model, prompts, seeds, params, pad_id=tok.pad_token_id)
    native = sample(model, prompts, seeds, params, pad_id=tok.pad_token_id)
    assert [g.tokens for g in drawn] == [g.tokens for g in native]
    assert len({tuple(g.tokens) for g in drawn}) > len(PROMPTS)  # seeds give different samples
    settings = ValidatorSettings()
    stats = recompute(
        model,
        prompts,
        [g.tokens for g in drawn],
        temperature=params.temperature,
        top_p=params.top_p,
        eos_id=tok.eos_token_id,
    )
    for gen, stat, seed in zip(drawn, stats, seeds, strict=True):
        result = replay(
            stat,
            seed,
            settings.replay_tolerance,
            settings.replay_floor,
            settings.replay_floor_tolerance,
        )
        assert result.misses == 0, f"seed {seed}: token {result.first_miss} misses its replay"
        assert np.abs(gen.logprobs - stat.logprobs).max() <= settings.logprob_tolerance
        assert gen.stopped_on_eos == (gen.tokens[-1] == tok.eos_token_id)
    proofs = [
        bytes_to_proofs(data, n_tokens=len(g.tokens), hidden_size=model.config.hidden_size)
        for data, g in zip(proof_column([g.hidden for g in drawn]), drawn, strict=True)
    ]
    assert check_toploc([s.hidden for s in stats], proofs, settings.toploc).passed


def test_colder_draw_misses_the_replay(engine_and_policy) -> None:
    """The `temperature` cheat through the engine: the validator replays at the run's T."""
    engine, model, tok = engine_and_policy
    prompts, seeds = _requests()
    cold = engine.sample(model, prompts, seeds, _params(tok, 0.3), pad_id=tok.pad_token_id)
    stats = recompute(
        model,
        prompts,
        [g.tokens for g in cold],
        temperature=0.6,
        top_p=1.0,
        eos_id=tok.eos_token_id,
    )
    misses = sum(replay(s, seed, 1e-5).misses for s, seed in zip(stats, seeds, strict=True))
    assert misses > 0


def test_policy_swapped_in_place(engine_and_policy) -> None:
    engine, model, tok = engine_and_policy
    prompts, seeds = _requests()
    params = _params(tok)
    before = engine.sample(model, prompts, seeds, params, pad_id=tok.pad_token_id)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for param in changed.parameters():
            param.mul_(1.1)
    started = engine.start_seconds
    after = engine.sample(changed, prompts, seeds, params, pad_id=tok.pad_token_id)
    native = sample(changed, prompts, seeds, params, pad_id=tok.pad_token_id)
    assert engine.start_seconds == started  # the same engine, not a new one
    assert [g.tokens for g in after] == [g.tokens for g in native]
    assert [g.tokens for g in after] != [g.tokens for g in before]
    # An in-place edit of the held policy (a trainer step, a cheater's quantization) is
    # seen too: the engine compares the weights' version counters.
    with torch.no_grad():
        next(changed.parameters()).mul_(0.5)
    edited = engine.sample(changed, prompts, seeds, params, pad_id=tok.pad_token_id)
    native = sample(changed, prompts, seeds, params, pad_id=tok.pad_token_id)
    assert [g.tokens for g in edited] == [g.tokens for g in native]
