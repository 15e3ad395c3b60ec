"""An env from a plugin file (tests/plugins/corridor.c, graphs only) through the Python package:
compiled and loaded by lumen, a Gymnasium env that passes check_env, a vector env with the spec's
spaces, and clear errors for a file that does not compile or is not there."""

import os

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import lumen
from conftest import CORRIDOR


def test_plugin_env_passes_check_env():
    env = lumen.make(CORRIDOR, device="cpu")
    assert env.env_name == "corridor"
    assert env.observation_space.shape == (40,)
    assert env.action_space.n == 3
    check_env(env, skip_render_check=True)
    env.close()


def test_plugin_vector_env_steps_and_auto_resets():
    envs = lumen.make_vec(CORRIDOR, 64, device="cpu", seed=2)
    obs, _ = envs.reset(seed=2)
    # obs: the agent's cell one-hot, then the goal's
    assert np.array_equal(obs.sum(axis=1), np.full(64, 2.0, np.float32))
    ended = 0
    for t in range(200):
        obs, rew, term, trunc, info = envs.step(envs.random_actions(t))
        done = term | trunc
        ended += int(done.sum())
        if done.any():
            assert np.array_equal(info["_final_obs"], done)
            for i in np.flatnonzero(done):
                assert info["final_obs"][i].shape == (40,)
        assert np.all(rew[term] == np.float32(1.0))  # reaching the goal pays +1
        assert np.allclose(rew[~term], -0.02)
        assert np.all(trunc <= (~term))
    assert ended > 0
    assert "corridor" in lumen.envs()
    envs.close()


def test_plugin_that_does_not_compile_names_the_file(tmp_path):
    bad = tmp_path / "broken_env.c"
    bad.write_text('#include "lumen/env.h"\nthis is not C;\n')
    with pytest.raises(lumen.LumenError) as e:
        lumen.make_vec(str(bad), 4, device="cpu")
    assert "broken_env.c" in str(e.value)


def test_missing_plugin_file_raises(tmp_path):
    with pytest.raises(lumen.LumenError) as e:
        lumen.make_vec(os.path.join(str(tmp_path), "nope.c"), 4)
    assert "nope.c" in str(e.value)
