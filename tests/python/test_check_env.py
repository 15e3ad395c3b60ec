"""Every built-in env passes Gymnasium's own checker as lumen.make's gymnasium.Env, and its
vector env declares Gymnasium 1.x's same-step auto-reset and spaces that match the single env."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import lumen

ENVS = lumen.envs()


def test_the_builtin_envs_are_listed():
    for name in ("cartpole", "pendulum", "mountaincar", "mountaincar-continuous", "acrobot", "minatar-breakout",
                 "minatar-space-invaders"):
        assert name in ENVS


@pytest.mark.parametrize("name", ENVS)
def test_check_env_passes(name):
    env = lumen.make(name, device="cpu")
    check_env(env, skip_render_check=True)
    env.close()


@pytest.mark.parametrize("name", ENVS)
def test_vector_env_spaces_and_autoreset_mode(name):
    single = lumen.make(name, device="cpu")
    envs = lumen.make_vec(name, 5, device="cpu", seed=3)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert envs.single_observation_space == single.observation_space
    assert envs.single_action_space == single.action_space
    obs, info = envs.reset(seed=3)
    assert obs.shape == (5, *single.observation_space.shape) and obs.dtype == np.float32
    assert obs in envs.observation_space
    envs.action_space.seed(1)
    for _ in range(3):
        obs, rew, term, trunc, info = envs.step(envs.action_space.sample())
        assert rew.shape == (5,) and rew.dtype == np.float32
        assert term.dtype == np.bool_ and trunc.dtype == np.bool_
        assert obs in envs.observation_space
    envs.close()
    single.close()


@pytest.mark.parametrize("name", ["cartpole", "minatar-breakout"])
def test_a_single_env_episode_is_the_vector_envs_first_env(name):
    # lumen.make is the vector env of one: same seed, same actions -> the same observations
    env = lumen.make(name, device="cpu", seed=9)
    vec = lumen.make_vec(name, 1, device="cpu", seed=9)
    o1, _ = env.reset(seed=9)
    o2, _ = vec.reset(seed=9)
    assert np.array_equal(o1, o2[0])
    for k in range(40):
        a = vec.random_actions(k)
        o1, r1, t1, u1, _ = env.step(a[0])
        o2, r2, t2, u2, info = vec.step(a)
        want = info["final_obs"][0] if (t2[0] or u2[0]) else o2[0]
        assert np.array_equal(o1, want) and r1 == r2[0] and t1 == t2[0] and u1 == u2[0]
        if t1 or u1:
            break
    assert t1 or u1, "a random policy ends a CartPole or Breakout episode within 40 steps"
