"""lumen.train("cartpole") from Python with rltrain's defaults reaches the solved threshold (mean
return of the last 100 episodes >= 475), and the checkpoint's greedy policy, loaded with
lumen.load_policy, plays lumen.make("cartpole") episodes to the same standard."""

import numpy as np

import lumen


def test_train_cartpole_to_475_and_play_it(tmp_path):
    run = lumen.train("cartpole", out=str(tmp_path / "cartpole"), seed=1, device="cpu")
    assert run.solved, run.summary
    assert run.mean_return >= 475.0
    assert run.summary["episodes_in_mean"] == 100
    assert run.log[-1]["env_steps"] == run.summary["env_steps"]

    pol = lumen.load_policy(run.checkpoint, device="cpu")
    env = lumen.make("cartpole", device="cpu")
    returns = []
    for ep in range(10):
        obs, _ = env.reset(seed=1000 + ep)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(pol.act(obs))
            total += r
            done = term or trunc
        returns.append(total)
    assert np.mean(returns) >= 475.0, returns
