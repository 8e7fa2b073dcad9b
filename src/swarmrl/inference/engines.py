"""Which sampler a worker generates with: swarmrl's own loop, or a vLLM engine (``inference.engine``).

Both draw with the same seeded uniforms and give the same rollout rows
(``generation.vllm_engine``); vLLM is imported only when the run asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from swarmrl.config import RunConfig
from swarmrl.generation.rollout import Sampler
from swarmrl.generation.sampler import sample

if TYPE_CHECKING:
    from swarmrl.generation.vllm_engine import VllmEngine


class EngineChoice:
    """The worker's sampler; a vLLM engine starts with the first policy it is given."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.engine: VllmEngine | None = None

    def sampler(self, model) -> Sampler:
        """The sampler for ``model`` (the policy the worker loaded, from its checkpoint folder)."""
        if self.cfg.inference.engine == "native":
            return sample
        if self.engine is None:
            from swarmrl.generation.vllm_engine import VllmEngine, vllm_available

            missing = vllm_available()
            if missing is not None:
                raise RuntimeError(
                    f"inference.engine = vllm, but {missing}: install it with "
                    '`pip install -e ".[vllm]"` (docs/architecture.md), or use the native engine'
                )
            self.engine = VllmEngine(
                Path(model.name_or_path),
                eager=self.cfg.inference.vllm_eager,
                kv_cache_gib=self.cfg.inference.vllm_kv_cache_gib,
            )
        return self.engine.sample
