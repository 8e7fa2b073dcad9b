"""Generation on a vLLM engine with swarmrl's own seeded draw, so validators replay it exactly.

Imported only when a worker's ``inference.engine`` is ``vllm`` (``pip install -e ".[vllm]"``).

Design choices:
- **The draw is swarmrl's.** vLLM's own sampler draws from its own random stream, which
  the validator cannot replay. A logits processor (``SeededDraw``, vLLM's v1 interface)
  sees each request's raw fp32 logits, draws token t with ``sampler.draw`` and the
  uniform ``uniforms(seed, t)`` (the seed and the sampling parameters travel in the
  request's ``extra_args``) and masks every other token; the engine then samples
  greedily, so it must emit that token. A sample's tokens are therefore what the native
  loop draws from the engine's logits: identical wherever the two compute the same
  logits to within the replay tolerance (docs/validator.md).
- **Proofs and logprobs from one prefill.** TOPLOC hashes the final-norm state of every
  generated token, and the file records each token's logprob under softmax(logits / T).
  Both come from one teacher-forced prefill of each finished sequence on the worker's
  own model (``fast_llama.continuation_states``, the computation the validator runs),
  not from inside the engine: no hook into vLLM's worker process, and a proof that
  depends on nothing vLLM-specific. ``benchmarks/bench_sampler.py`` measures its cost.
- **Weights swapped in place.** The engine is built once, from the downloaded
  checkpoint's config with placeholder weights, and every policy the worker generates
  with (the first one included) is copied into it with the model's own ``load_weights``;
  its prefix cache is then reset, since cached keys and values belong to the old
  weights. The engine is never restarted for a new checkpoint.
- **One process, few threads.** The engine runs in the worker's process (vLLM's
  multiprocessing off), its OpenMP threads unbound, its key/value cache sized by
  ``inference.vllm_kv_cache_gib``: on a shared CPU machine vLLM otherwise pins a thread
  to every core and takes a large share of memory.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

from swarmrl.generation.fast_llama import continuation_states, fast_decoder, supports_fast_path
from swarmrl.generation.sampler import Generation, SamplingParams, draw, uniforms

log = logging.getLogger("swarmrl.worker")

# What vLLM reads from the environment, set (when the user has not) before it is imported.
_VLLM_DEFAULTS = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# The request's extra_args that carry swarmrl's draw.
SEED_KEY = "swarmrl_seed"
TEMPERATURE_KEY = "swarmrl_temperature"
TOP_P_KEY = "swarmrl_top_p"


def vllm_available() -> str | None:
    """None when vLLM imports here, else why not (for a skipped test or an error message)."""
    try:
        import vllm  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:  # OSError: a .so built for another torch
        return f"vLLM does not import here ({type(exc).__name__}: {exc})"
    return None


def _seeded_draw_class():
    """The ``SeededDraw`` logits processor class (built here so vLLM is imported lazily)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    class SeededDraw(LogitsProcessor):
        """Replaces each swarmrl request's logits by a one-hot of swarmrl's draw."""

        def __init__(self, vllm_config, device, is_pin_memory) -> None:
            # batch row -> (seed, temperature, top_p, the request's live output token list)
            self.rows: dict[int, tuple[int, float, float, list[int]]] = {}

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            args = sampling_params.extra_args or {}
            if SEED_KEY in args and not 0 <= int(args[SEED_KEY]) < 1 << 64:
                raise ValueError(f"{SEED_KEY} must be a 64-bit unsigned seed")

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            for row in batch_update.removed:
                self.rows.pop(row, None)
            for row, params, _prompt, output in batch_update.added:
                args = params.extra_args or {}
                if SEED_KEY in args:
                    self.rows[row] = (
                        int(args[SEED_KEY]),
                        float(args[TEMPERATURE_KEY]),
                        float(args[TOP_P_KEY]),
                        output,
                    )
                else:
                    self.rows.pop(row, None)
            for src, dst, direction in batch_update.moved:
                moving, other = self.rows.pop(src, None), self.rows.pop(dst, None)
                if moving is not None:
                    self.rows[dst] = moving
                if direction == MoveDirectionality.SWAP and other is not None:
                    self.rows[src] = other

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if not self.rows:
                return logits
            # One draw per (temperature, top_p) the batch holds: one in an honest pool.
            groups: dict[tuple[float, float], list[int]] = {}
            for row, (_, temperature, top_p, _) in self.rows.items():
                groups.setdefault((temperature, top_p), []).append(row)
            for (temperature, top_p), rows in groups.items():
                seeds = np.array([self.rows[r][0] for r in rows], dtype=np.uint64)
                steps = np.array([len(self.rows[r][3]) for r in rows], dtype=np.uint64)
                index = torch.tensor(rows, dtype=torch.long)
                tokens, _ = draw(logits[index], uniforms(seeds, steps), temperature, top_p)
                logits[index] = float("-inf")
                logits[index, tokens.to(logits.device)] = 0.0
            return logits

    return SeededDraw


class VllmEngine:
    """A vLLM engine that samples like ``sampler.sample`` and swaps policies in place."""

    def __init__(
        self,
        checkpoint: Path,
        *,
        max_model_len: int | None = None,
        eager: bool = True,
        kv_cache_gib: int = 1,
    ) -> None:
        for key, value in _VLLM_DEFAULTS.items():
            os.environ.setdefault(key, value)
        # Not the user's choice: the logits processor class is built in this process
        # (vLLM is imported lazily) and cannot be pickled to a separate engine process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        from vllm import LLM

        start = time.perf_counter()
        self.llm = LLM(
            model=str(checkpoint),
            dtype="float32",
            load_format="dummy",  # every policy, the first too, arrives through `load`
            skip_tokenizer_init=True,
            enable_prefix_caching=True,
            enforce_eager=eager,
            max_model_len=max_model_len,
            logits_processors=[_seeded_draw_class()],
            disable_log_stats=True,
        )
        self.start_seconds = time.perf_counter() - start
        self.reload_seconds: list[float] = []
        # The last `sample` call's split: the engine's generation, then the prefill.
        self.engine_seconds = 0.0
        self.prefill_seconds = 0.0
        self._policy: torch.nn.Module | None = None
        self._versions: tuple[int, ...] = ()
        log.info("vLLM engine started in %.1f s from %s", self.start_seconds, checkpoint)

    def load(self, model: torch.nn.Module) -> float:
        """Copy ``model``'s weights into the running engine; returns the seconds it took."""
        start = time.perf_counter()
        weights = [(name, tensor.detach().float()) for name, tensor in model.state_dict().items()]
        # vLLM's in-place reload: checkpoint-format weights through the model's loaders,
        # then the same post-processing (repacking for the CPU kernels) as at start.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()
        seconds = time.perf_counter() - start
        self.reload_seconds.append(seconds)
        self._policy = model
        self._versions = _weight_versions(model)
        log.info("vLLM engine: weights swapped in place in %.3f s", seconds)
        return seconds

    def sample(
        self,
        model,
        prompts: list[list[int]],
        seeds: list[int] | np.ndarray,
        params: SamplingParams,
        pad_id: int,
        capture_hidden: bool = True,
    ) -> list[Generation]:
        """``sampler.sample`` on the engine: same tokens, logprobs and hidden states.

        ``model`` is the policy to sample from; it is copied into the engine first when
        the engine holds another one (or the same one since changed in place).
        """
        from vllm import SamplingParams as EngineParams

        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        seeds = np.asarray(seeds, dtype=np.uint64)
        if seeds.shape != (len(prompts),):
            raise ValueError(
                f"need one seed per prompt: {len(prompts)} prompts, {seeds.shape} seeds"
            )
        if not supports_fast_path(model):
            raise ValueError(
                "the vllm engine builds proofs with the Llama-family prefill "
                "(llama, qwen2, mistral without a sliding window, fp32): "
                f"{model.config.model_type} in {model.dtype} is not one; use inference.engine = native"
            )
        held = self._policy is model  # the engine's copy may still be stale: a step edits in place
        if not held or _weight_versions(model) != self._versions:
            self.load(model)
        requests = [
            EngineParams(
                temperature=0.0,  # greedy over the one token SeededDraw leaves
                max_tokens=params.max_new_tokens,
                stop_token_ids=[params.eos_token_id],
                extra_args={
                    SEED_KEY: int(seed),
                    TEMPERATURE_KEY: params.temperature,
                    TOP_P_KEY: params.top_p,
                },
            )
            for seed in seeds
        ]
        start = time.perf_counter()
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], requests, use_tqdm=False
        )
        completions = [list(out.outputs[0].token_ids) for out in outputs]
        middle = time.perf_counter()
        generations = prefilled_generations(model, prompts, completions, params, capture_hidden)
        self.engine_seconds = middle - start
        self.prefill_seconds = time.perf_counter() - middle
        return generations


@torch.inference_mode()
def prefilled_generations(
    model,
    prompts: list[list[int]],
    completions: list[list[int]],
    params: SamplingParams,
    capture_hidden: bool = True,
) -> list[Generation]:
    """Generations for given completions: logprobs and final-norm states from one prefill."""
    states = continuation_states(fast_decoder(model), prompts, completions)
    head = model.get_output_embeddings()
    out = []
    for tokens, state in zip(completions, states, strict=True):
        logp = torch.log_softmax(head(state).float() / params.temperature, dim=-1)
        token_logp = logp.gather(-1, torch.tensor(tokens, device=logp.device)[:, None]).squeeze(-1)
        out.append(
            Generation(
                tokens=tokens,
                logprobs=token_logp.cpu().numpy().astype(np.float32),
                hidden=state.to("cpu", torch.bfloat16) if capture_hidden else None,
                stopped_on_eos=tokens[-1] == params.eos_token_id,
            )
        )
    return out


def _weight_versions(model: torch.nn.Module) -> tuple[int, ...]:
    """Torch's in-place version counters of the weights: they change when a step edits them."""
    return tuple(p._version for p in model.parameters())
