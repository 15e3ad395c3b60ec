"""lumen.train from Python (a short run) and lumen.load_policy(ckpt).act(obs): the run's log as
Python data, actions of the right type and shape, a batch acting as its rows do, greedy actions
as the argmax, sampled actions reproducible by seed, and bad observations refused."""

import numpy as np
import pytest

import lumen


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "cartpole"
    return lumen.train("cartpole", out=str(out), progress=False, device="cpu", envs=8, steps=32, total_steps=2048,
                       seed=3, stop=False)


def test_run_is_plain_data(short_run):
    run = short_run
    assert len(run.log) == 8  # 2048 steps / (8 envs x 32 steps)
    assert [r["iteration"] for r in run.log] == list(range(1, 9))
    assert run.log[-1]["env_steps"] == 2048
    assert run.summary["env_steps"] == 2048 and run.summary["env"] == "cartpole"
    assert run.settings["envs"] == 8 and run.settings["seed"] == 3
    assert run.checkpoint.endswith("latest.ckpt")


def test_policy_acts_on_batches_and_single_observations(short_run):
    pol = lumen.load_policy(short_run.checkpoint, device="cpu")
    assert pol.env_name == "cartpole" and pol.action_space.n == 2
    envs = lumen.make_vec("cartpole", 32, device="cpu", seed=1)
    obs, _ = envs.reset()
    a = pol.act(obs)
    assert a.shape == (32,) and a.dtype == np.int64 and set(np.unique(a)) <= {0, 1}
    assert all(pol.act(obs[i]) == a[i] for i in range(32))
    obs, *_ = envs.step(a)
    assert pol.act(obs).shape == (32,)
    # a run directory works as well as its checkpoint
    assert np.array_equal(lumen.load_policy(short_run.dir).act(obs), pol.act(obs))


def test_sampled_actions_follow_the_seed(short_run):
    obs = lumen.make_vec("cartpole", 256, seed=2).reset()[0]
    p1 = lumen.load_policy(short_run.checkpoint, seed=5)
    p2 = lumen.load_policy(short_run.checkpoint, seed=5)
    s1, s2 = p1.act(obs, greedy=False), p2.act(obs, greedy=False)
    assert np.array_equal(s1, s2)
    assert not np.array_equal(s1, p1.act(obs, greedy=False)), "the next call draws anew"


def test_bad_observations(short_run):
    pol = lumen.load_policy(short_run.checkpoint)
    with pytest.raises(ValueError):
        pol.act(np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError):
        pol.act(np.zeros((0, 4), np.float32))
    with pytest.raises(lumen.LumenError) as e:
        pol.act(np.array([[0, 0, np.nan, 0]], np.float32))
    assert "observation 0" in str(e.value)
    pol.close()
    with pytest.raises(lumen.LumenError):
        pol.act(np.zeros(4, np.float32))


def test_box_policy_gives_float_actions(tmp_path):
    run = lumen.train("pendulum", out=str(tmp_path / "p"), progress=False, envs=4, steps=16, total_steps=128,
                      stop=False, hidden=(16, 16))
    pol = lumen.load_policy(run.checkpoint)
    obs = lumen.make_vec("pendulum", 5).reset()[0]
    a = pol.act(obs)
    assert a.shape == (5, 1) and a.dtype == np.float32
    assert pol.act(obs, greedy=False).shape == (5, 1)


def test_progress_lines(tmp_path, capsys):
    lumen.train("cartpole", out=str(tmp_path / "q"), envs=4, steps=16, total_steps=128, stop=False)
    text = capsys.readouterr().out
    assert "iter 1:" in text and "iter 2:" in text and "done:" in text
