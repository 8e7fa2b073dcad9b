"""Rewards and group advantages (docs/architecture.md §3): pure functions, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

ADVANTAGE_EPS = 1e-6
# Rewards closer than this count as equal: a group whose rewards all agree carries no
# learning signal and is dropped by online filtering.
REWARD_TIE = 1e-6


@dataclass(frozen=True)
class Reward:
    """The parts of one sample's reward."""

    task_reward: float
    length_penalty: float

    @property
    def total(self) -> float:
        return self.task_reward - self.length_penalty


# How the length target shapes the reward (the run's ``task.length_shaping``):
# "subtract": reward = task reward - alpha * |target - length| (the paper's);
# "scale" (the default): reward = task reward * exp(-alpha * |target - length|): the length
# only ranks samples of equal task reward, so no length makes up for a wrong answer
# (docs/trainer.md).
LengthShaping = Literal["subtract", "scale"]
# The default: "scale" kept every measured run's training reward above 0.7 after step 10
# (docs/trainer.md); every function here and the configuration default to it alike.
DEFAULT_SHAPING: LengthShaping = "scale"


def length_penalty(
    target_length: int | None,
    completion_length: int,
    alpha: float,
    *,
    task_reward: float = 0.0,
    shaping: LengthShaping = DEFAULT_SHAPING,
) -> float:
    """What the length target takes off the task reward; zero when the prompt has no
    target (target None or < 0). ``subtract``: alpha * |target - length|; ``scale``:
    task_reward * (1 - exp(-alpha * |target - length|)).

    alpha is the run's ``task.length_alpha``; the result is the sample's length penalty.
    """
    if target_length is None or target_length < 0:
        return 0.0
    miss = alpha * abs(target_length - completion_length)
    if shaping == "scale":
        return task_reward * -math.expm1(-miss)
    return miss


def score_sample(
    task_reward: float,
    target_length: int | None,
    completion_length: int,
    alpha: float,
    shaping: LengthShaping = DEFAULT_SHAPING,
) -> Reward:
    return Reward(
        task_reward=task_reward,
        length_penalty=length_penalty(
            target_length, completion_length, alpha, task_reward=task_reward, shaping=shaping
        ),
    )


def group_advantages(rewards: np.ndarray | list[float]) -> np.ndarray:
    """A = (r - mean) / (std + 1e-6) within one group (population std, as in GRPO)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        raise ValueError("a group needs at least one reward")
    return ((r - r.mean()) / (r.std() + ADVANTAGE_EPS)).astype(np.float32)


# How a group's advantages are formed (the run's ``task.advantage_mode``):
# "joint": normalize the total reward within the group (GRPO's);
# "decoupled": normalize the task reward and the negated length penalty each within the
# group, add them, and normalize the sum, so a spread in length never drowns a spread in
# correctness (docs/trainer.md);
# "centered": the total reward minus the group's mean, not divided by its std (Dr. GRPO,
# Liu et al. 2025): a nearly solved group's one wrong sample no longer gets a large
# normalized advantage.
AdvantageMode = Literal["joint", "decoupled", "centered"]


def shaped_advantages(
    task_rewards: np.ndarray | list[float],
    length_penalties: np.ndarray | list[float],
    mode: AdvantageMode = "joint",
) -> np.ndarray:
    """One group's advantages from its task rewards and length penalties (see above)."""
    task = np.asarray(task_rewards, dtype=np.float64)
    penalty = np.asarray(length_penalties, dtype=np.float64)
    if mode == "joint":
        return group_advantages(task - penalty)
    if mode == "centered":
        total = task - penalty
        return (total - total.mean()).astype(np.float32)
    parts = group_advantages(task).astype(np.float64) + group_advantages(-penalty)
    # The parts are z-scores: a spread this small is the 1e-6 of their denominators.
    if parts.max() - parts.min() <= 1e-4:
        return np.zeros(len(parts), dtype=np.float32)
    return group_advantages(parts)


def has_signal(rewards: np.ndarray | list[float]) -> bool:
    """False when every reward in the group is the same (zero advantage everywhere)."""
    r = np.asarray(rewards, dtype=np.float64)
    return bool(r.max() - r.min() > REWARD_TIE)
