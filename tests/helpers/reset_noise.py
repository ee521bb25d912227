"""gymnasium v5's reset distribution, as a check another engine's resets must pass.

gymnasium's ``reset_model`` (read from its source, written here independently of vaco's task
table): ``qpos = init_qpos + U(-s, s)`` for every task; ``qvel = init_qvel + U(-s, s)``, except
HalfCheetah and Ant, whose velocities are ``init_qvel + s * N(0, 1)``. ``s`` is the env's
``_reset_noise_scale``.

The check pools the coordinates (each is an independent draw) and tests the first two moments
against 5 standard errors: with a few thousand draws, a scale 10% off moves the second moment
by ~20%, which is many standard errors (a Kolmogorov-Smirnov test on two dozen episode returns,
which this replaces, could not see it).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

NORMAL_QVEL = {"HalfCheetah-v5", "Ant-v5"}


def gymnasium_reset(env_id: str) -> tuple[np.ndarray, np.ndarray, float, str]:
    """``(init_qpos, init_qvel, s, qvel_kind)`` read from gymnasium's own env."""
    env = gym.make(env_id).unwrapped
    kind = "normal" if env_id in NORMAL_QVEL else "uniform"
    return env.init_qpos.copy(), env.init_qvel.copy(), float(env._reset_noise_scale), kind


def check_draws(deviations: np.ndarray, scale: float, kind: str, what: str, atol: float = 1e-6) -> None:
    """``deviations`` (any shape) are draws of ``U(-scale, scale)`` or ``scale * N(0, 1)``."""
    x = np.asarray(deviations, dtype=np.float64).ravel()
    n = x.size
    assert n >= 1000, f"{what}: too few draws ({n}) to test"
    if kind == "uniform":
        assert np.abs(x).max() <= scale + atol, f"{what}: a draw outside +-{scale}: {np.abs(x).max()}"
        assert np.abs(x).max() >= 0.95 * scale, f"{what}: draws fill only +-{np.abs(x).max()} of +-{scale}"
        second, fourth = scale**2 / 3, scale**4 / 5
    else:
        second, fourth = scale**2, 3 * scale**4
    mean_se = np.sqrt(second / n)
    assert abs(x.mean()) <= 5 * mean_se, f"{what}: mean {x.mean():.3g}, expected 0 +- {5 * mean_se:.2g}"
    m2 = float((x**2).mean())
    m2_se = np.sqrt((fourth - second**2) / n)
    assert abs(m2 - second) <= 5 * m2_se, (
        f"{what}: mean square {m2:.4g}, expected {second:.4g} +- {5 * m2_se:.2g} ({kind}, scale {scale})"
    )
