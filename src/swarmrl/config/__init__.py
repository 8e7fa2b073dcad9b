"""Typed run configuration: pydantic models, TOML loading and command-line overrides.

Every field carries its help text; `swarmrl run --help` prints them all. A value can
come from the defaults, a TOML file (`--config FILE`), or a flag named after its
dotted path (`--trainer.lr 1e-3`), later sources winning.

`sections.py` holds one model per role or mechanism, `run.py` the `RunConfig` that
composes them (and what a resumed run must share), `loading.py` the file and flag
loading. The orchestrator's settings are derived from a `RunConfig` in
`swarmrl.orchestrator.config.orchestrator_settings`.
"""

from swarmrl.config.loading import (
    ConfigError,
    add_config_arguments,
    config_from_args,
    load_config,
    one_line,
    read_config_file,
)
from swarmrl.config.run import RUN_IDENTITY, RunConfig, run_differences
from swarmrl.config.sections import (
    CONTEXT_TOKENS,
    InferenceConfig,
    ModelConfig,
    PoolConfig,
    SamplingConfig,
    ShardcastConfig,
    SupervisionConfig,
    TaskConfig,
    TrainerConfig,
    ValidatorConfig,
    WorkerConfig,
)

__all__ = [
    "CONTEXT_TOKENS",
    "RUN_IDENTITY",
    "ConfigError",
    "InferenceConfig",
    "ModelConfig",
    "PoolConfig",
    "RunConfig",
    "SamplingConfig",
    "ShardcastConfig",
    "SupervisionConfig",
    "TaskConfig",
    "TrainerConfig",
    "ValidatorConfig",
    "WorkerConfig",
    "add_config_arguments",
    "config_from_args",
    "load_config",
    "one_line",
    "read_config_file",
    "run_differences",
]
