"""Rewards, length penalties and group advantages against hand-computed numbers."""

import numpy as np
import pytest

from swarmrl.rewards import (
    group_advantages,
    has_signal,
    length_penalty,
    score_sample,
    shaped_advantages,
)


def test_length_penalty():
    def sub(*args):
        return length_penalty(*args, shaping="subtract")

    assert sub(40, 32, 0.02) == pytest.approx(0.16)
    assert sub(32, 40, 0.02) == pytest.approx(0.16)
    assert sub(1000, 1000, 3e-4) == 0.0
    assert sub(-1, 500, 0.02) == 0.0  # no target in the prompt
    assert sub(None, 500, 0.02) == 0.0


def test_the_default_shaping_is_scale_everywhere():
    """The configuration and every function that takes a shaping agree on the default."""
    from swarmrl.config import RunConfig

    assert RunConfig().task.length_shaping == "scale"
    assert score_sample(1.0, 41, 50, 0.2).total == pytest.approx(np.exp(-1.8))
    assert length_penalty(41, 50, 0.2) == 0.0  # scale: no task reward, nothing to take


def test_subtracted_reward_is_task_reward_minus_penalty():
    r = score_sample(1.0, 44, 33, 0.02, "subtract")
    assert r.task_reward == 1.0
    assert r.length_penalty == pytest.approx(0.22)
    assert r.total == pytest.approx(0.78)


def test_group_advantages_hand_computed():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> A = +-0.5 / (0.5 + 1e-6)
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    expected = 0.5 / (0.5 + 1e-6)
    np.testing.assert_allclose(adv, [expected, -expected, -expected, expected], rtol=1e-6)
    # rewards 3, 1, 2: mean 2, std sqrt(2/3)
    adv = group_advantages([3.0, 1.0, 2.0])
    s = np.sqrt(2 / 3) + 1e-6
    np.testing.assert_allclose(adv, [1 / s, -1 / s, 0.0], rtol=1e-6, atol=1e-7)


def test_uniform_group_has_zero_advantage_and_no_signal():
    adv = group_advantages([0.7] * 8)
    assert np.all(adv == 0.0)
    assert not has_signal([0.7] * 8)
    assert has_signal([0.7] * 7 + [0.69])


def test_scaled_length_shaping_multiplies_the_task_reward():
    """task.length_shaping = "scale": reward = task * exp(-alpha * |target - length|), so a
    wrong answer scores 0 whatever its length and a right one in the wrong style (9 tokens
    off, alpha 0.2) e^-1.8 = 0.165, still above every wrong answer."""
    right_but_long = score_sample(1.0, 41, 50, 0.2, "scale")
    assert right_but_long.total == pytest.approx(0.16529888822158653)
    assert right_but_long.length_penalty == pytest.approx(1 - 0.16529888822158653)
    wrong_on_target = score_sample(0.0, 41, 41, 0.2, "scale")
    assert wrong_on_target.total == 0.0 and wrong_on_target.length_penalty == 0.0
    assert score_sample(0.0, 41, 50, 0.2, "scale").total == 0.0
    assert score_sample(1.0, 41, 41, 0.2, "scale").total == 1.0
    assert score_sample(0.5, 41, 42, 0.2, "scale").total == pytest.approx(0.5 * np.exp(-0.2))
    assert length_penalty(None, 50, 0.2, task_reward=1.0, shaping="scale") == 0.0
    # the paper's subtraction ranks them the other way round
    assert (
        score_sample(1.0, 41, 50, 0.2, "subtract").total
        < score_sample(0.0, 41, 41, 0.2, "subtract").total
    )


def test_decoupled_advantages_normalize_correctness_and_length_apart():
    """Two right answers 9 tokens off (penalty 1.8) and two wrong ones on target: jointly
    the wrong ones win; decoupled, correctness and length weigh alike and cancel."""
    task, penalty = [1.0, 1.0, 0.0, 0.0], [1.8, 1.8, 0.0, 0.0]
    joint = shaped_advantages(task, penalty)
    assert joint == pytest.approx([-1, -1, 1, 1], abs=1e-5)
    assert shaped_advantages(task, penalty, "decoupled") == pytest.approx([0, 0, 0, 0])
    # right/long, right/short, wrong/long, wrong/short: z(task) = [1, 1, -1, -1],
    # z(-penalty) = [-1, 1, -1, 1]; their sum [0, 2, -2, 0] normalized: [0, 1.414, -1.414, 0]
    mixed = shaped_advantages([1.0, 1.0, 0.0, 0.0], [0.4, 0.0, 0.4, 0.0], "decoupled")
    assert mixed == pytest.approx([0, 2**0.5, -(2**0.5), 0], abs=1e-5)
    # only the length varies: the same as the joint advantages
    same = ([1.0] * 4, [0.0, 0.2, 0.4, 0.6])
    assert shaped_advantages(*same, "decoupled") == pytest.approx(
        shaped_advantages(*same), abs=1e-5
    )
    assert not shaped_advantages([1.0] * 4, [0.2] * 4, "decoupled").any()


def test_the_length_curriculum_moves_alpha_linearly_then_holds_it():
    from swarmrl.config.sections import TaskConfig

    plain = TaskConfig()
    assert [plain.alpha_at(s) for s in (0, 5, 50)] == [0.2, 0.2, 0.2]
    curriculum = TaskConfig(length_alpha_start=1.0, length_alpha_steps=10)
    assert curriculum.alpha_at(0) == 1.0
    assert curriculum.alpha_at(5) == pytest.approx(0.6)
    assert curriculum.alpha_at(10) == curriculum.alpha_at(49) == 0.2


def test_centered_advantages_are_not_divided_by_the_spread():
    # seven right, one wrong: GRPO gives the wrong one -2.65; centered, -0.875
    task = [1.0] * 7 + [0.0]
    joint = shaped_advantages(task, [0.0] * 8)
    assert joint[-1] == pytest.approx(-(7**0.5), rel=1e-4)
    centered = shaped_advantages(task, [0.0] * 8, "centered")
    assert centered == pytest.approx([0.125] * 7 + [-0.875])
