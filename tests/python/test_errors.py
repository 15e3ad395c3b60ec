"""Bad inputs raise Python exceptions carrying lumen's message, never crash the interpreter:
unknown envs, devices and parameters, bad sizes and seeds, actions of the wrong shape, type or
value, steps before a reset or after close, bad training settings, and checkpoints that are
missing or corrupt."""

import os

import numpy as np
import pytest

import lumen


def test_unknown_env_names_it():
    with pytest.raises(lumen.LumenError) as e:
        lumen.make_vec("no-such-env", 4)
    assert "no-such-env" in str(e.value)


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), (2.5, TypeError), ("4", TypeError),
                                      (True, TypeError)])
def test_bad_num_envs(bad, exc):
    with pytest.raises(exc):
        lumen.make_vec("cartpole", bad)


def test_too_many_envs_is_refused_by_lumen():
    with pytest.raises(lumen.LumenError) as e:
        lumen.make_vec("cartpole", 1 << 40)
    assert "num_envs" in str(e.value)


def test_unknown_device():
    with pytest.raises(lumen.LumenError) as e:
        lumen.make_vec("cartpole", 4, device="tpu")
    assert "tpu" in str(e.value)


@pytest.mark.parametrize("params, word", [({"time_limit": 0}, "time_limit"), ({"sticky": 1.5}, "sticky"),
                                          ({"colour": 3}, "colour"), ({"actions": "nope"}, "nope")])
def test_bad_env_parameters_name_the_key(params, word):
    name = "minatar-breakout" if "actions" in params else "cartpole"
    with pytest.raises(lumen.LumenError) as e:
        lumen.make_vec(name, 4, **params)
    assert word in str(e.value)


def test_bad_seeds():
    with pytest.raises(ValueError):
        lumen.make_vec("cartpole", 2, seed=-1)
    envs = lumen.make_vec("cartpole", 2)
    with pytest.raises(TypeError):
        envs.reset(seed=[1, 2])
    with pytest.raises(TypeError):
        envs.reset(seed=1.5)
    with pytest.raises(ValueError):
        envs.reset(seed=1 << 64)
    with pytest.raises(ValueError):
        envs.reset(options={"reset_mask": np.ones(2, bool)})
    envs.close()


def test_step_before_reset():
    envs = lumen.make_vec("cartpole", 3)
    with pytest.raises(lumen.LumenError) as e:
        envs.step(np.zeros(3, np.int64))
    assert "reset" in str(e.value)


def test_discrete_actions_are_checked():
    envs = lumen.make_vec("cartpole", 3, seed=1)
    envs.reset()
    with pytest.raises(ValueError) as e:
        envs.step(np.zeros(4, np.int64))
    assert "(3,)" in str(e.value)
    with pytest.raises(ValueError):
        envs.step(np.zeros((3, 2), np.int64))
    for bad in ([0, 2, 0], [0, -1, 0], [0.5, 0, 0], [np.nan, 0, 0]):
        with pytest.raises(lumen.LumenError) as e:
            envs.step(np.array(bad))
        assert "Discrete(2)" in str(e.value)
    with pytest.raises(TypeError):
        envs.step(np.array(["a", "b", "c"]))
    # after all that, the env still steps, and accepts lists and other integer types
    obs, *_ = envs.step([1, 0, 1])
    obs, *_ = envs.step(np.array([1, 0, 1], np.uint8))
    obs, *_ = envs.step(np.array([1.0, 0.0, 1.0]))
    assert obs.shape == (3, 4)


def test_box_actions_are_checked():
    envs = lumen.make_vec("pendulum", 2, seed=1)
    envs.reset()
    with pytest.raises(ValueError):
        envs.step(np.zeros(2, np.float32))  # needs (2, 1)... a (2,) array is not the shape
    with pytest.raises(lumen.LumenError) as e:
        envs.step(np.array([[0.0], [np.inf]], np.float32))
    assert "not finite" in str(e.value)
    with pytest.raises(lumen.LumenError):
        envs.step(np.array([[0], [1]], np.int64))
    obs, *_ = envs.step(np.array([[5.0], [-5.0]], np.float32))  # outside the bounds: lumen clips
    assert obs.shape == (2, 3)


def test_closed_envs_raise_and_close_twice_is_harmless():
    envs = lumen.make_vec("cartpole", 2)
    obs, _ = envs.reset()
    envs.close()
    envs.close()
    assert envs.closed
    for call in (lambda: envs.reset(), lambda: envs.step([0, 0]), lambda: envs.random_actions(0),
                 lambda: envs.state()):
        with pytest.raises(lumen.LumenError) as e:
            call()
        assert "closed" in str(e.value)
    assert obs.shape == (2, 4) and np.isfinite(obs).all()  # arrays handed out stay valid
    env = lumen.make("cartpole")
    env.reset()
    env.close()
    with pytest.raises(lumen.LumenError):
        env.step(0)


def test_single_env_action_shape():
    env = lumen.make("cartpole")
    env.reset(seed=0)
    with pytest.raises(ValueError):
        env.step([0, 1])
    with pytest.raises(lumen.LumenError):
        env.step(3)
    env.close()


def test_bad_training_settings_raise_with_rltrains_message(tmp_path):
    with pytest.raises(TypeError) as e:
        lumen.train("cartpole", out=str(tmp_path / "r"), progress=False, colour=3)
    assert "colour" in str(e.value)
    with pytest.raises(ValueError) as e:
        lumen.train("cartpole", out=str(tmp_path / "r"), progress=False, envs=0)
    assert "--envs" in str(e.value)
    with pytest.raises(ValueError) as e:
        lumen.train("no-such-env", out=str(tmp_path / "r"), progress=False)
    assert "no-such-env" in str(e.value)


def test_missing_or_corrupt_checkpoint(tmp_path):
    with pytest.raises(lumen.LumenError) as e:
        lumen.load_policy(str(tmp_path / "missing.ckpt"))
    assert "missing.ckpt" in str(e.value)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(os.urandom(256))
    with pytest.raises(lumen.LumenError):
        lumen.load_policy(str(bad))
    with pytest.raises(ValueError):
        lumen.load_policy("")
