"""Build the configured task."""

from __future__ import annotations

from pathlib import Path

from swarmrl.config import TaskConfig
from swarmrl.tasks.base import Task


def build_task(cfg: TaskConfig) -> Task:
    """The task named in the config, loading the user's problem files where needed."""
    if cfg.name == "arithmetic":
        from swarmrl.tasks.arithmetic import ArithmeticTask

        if cfg.eval_path:
            raise ValueError(
                f"task.eval_path ({cfg.eval_path}) does not apply to the arithmetic task: its "
                "held-out split is fixed by task.eval_size; remove task.eval_path"
            )
        return ArithmeticTask(eval_size=cfg.eval_size, path=cfg.path)
    # With a separate eval file, all of it is the held-out split: eval_size does not apply.
    eval_path = Path(cfg.eval_path) if cfg.eval_path else None
    eval_size = None if eval_path else cfg.eval_size
    if cfg.path is None:
        raise ValueError(f"task {cfg.name!r} needs task.path (a JSONL or Parquet problem file)")
    if cfg.name == "math":
        from swarmrl.tasks.math import MathTask

        return MathTask(Path(cfg.path), eval_path=eval_path, eval_size=eval_size)
    if cfg.name == "code":
        from swarmrl.tasks.code import CodeTask

        return CodeTask(Path(cfg.path), eval_path=eval_path, eval_size=eval_size)
    raise ValueError(f"unknown task {cfg.name!r}")
