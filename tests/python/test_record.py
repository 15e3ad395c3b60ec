"""A vector env's transitions against `rltrain record`'s for the same seed.

What record does (train/cli_main.c): episode i starts from ref_reset(seed, i, run 0) — the reset
graph's draw for env i under (seed, run 0) — and takes lm_env_ref_random_action(seed, i, t) at
step t; it steps the scalar reference stepper (the graphs on the ref backend for an env without
one), without the vec env's sticky actions. make_vec(env, K, seed=S) draws env i's first state
under the same key, and random_actions(t) are record's actions, so:
- the streams are the same, bit for bit: every episode's first state and every action;
- replayed one step each from record's own states (set_state), every transition equals the
  file within the env's `rltrain check` tolerances (0: exact, for MinAtar's integer games);
- stepping freely, the integer games and an env with no reference stepper (record then runs the
  same graphs) give record's file bit for bit, episode lengths included.
MinAtar's envs are made with sticky=0, as record steps them."""

import numpy as np
import pytest

import lumen
from conftest import CORRIDOR, record

K, SEED = 6, 11


def params(name):
    return {"sticky": 0} if name.startswith("minatar") else {}


def columns(envs):
    i = envs._info
    S, A, O = int(i.state_size), envs._asize, int(i.obs_size)
    c = {"ep": 0, "t": 1}
    c["s"] = slice(2, 2 + S)
    c["a"] = slice(2 + S, 2 + S + A)
    c["next"] = slice(2 + S + A, 2 + 2 * S + A)
    c["obs"] = slice(2 + 2 * S + A, 2 + 2 * S + A + O)
    c["reward"], c["term"], c["trunc"] = 2 + 2 * S + A + O, 3 + 2 * S + A + O, 4 + 2 * S + A + O
    return c


def f32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32)


@pytest.mark.parametrize("name", lumen.envs())
def test_streams_and_one_step_transitions_equal_record(name, tmp_path):
    head, rows = record(name, str(tmp_path / "rec.csv"), K, SEED)
    envs = lumen.make_vec(name, K, device="cpu", seed=SEED, **params(name))
    c = columns(envs)
    tol = envs.tolerances
    envs.reset(seed=SEED)
    state = envs.state()
    first = rows[rows[:, c["t"]] == 0]
    assert first.shape[0] == K
    assert np.array_equal(state, f32(first[:, c["s"]])), "first states differ from record's"
    T = int(rows[:, c["t"]].max()) + 1
    checked = 0
    for t in range(T):
        at = rows[rows[:, c["t"]] == t]
        eps = at[:, c["ep"]].astype(int)
        a = envs.random_actions(t)
        want_a = f32(at[:, c["a"]])
        assert np.array_equal(np.asarray(a, np.float32).reshape(K, -1)[eps], want_a), f"actions differ at t={t}"
        s = envs.state()
        s[eps] = f32(at[:, c["s"]])
        envs.set_state(s)
        obs, rew, term, trunc, info = envs.step(a)
        nxt = envs.state()
        for j, e in enumerate(eps):
            row = at[j]
            assert bool(term[e]) == bool(row[c["term"]]) and bool(trunc[e]) == bool(row[c["trunc"]]), (name, t, e)
            got_obs = info["final_obs"][e] if (term[e] or trunc[e]) else obs[e]
            want = f32(row[c["obs"]]).astype(np.float64)
            assert np.all(np.abs(np.asarray(got_obs, np.float64).ravel() - want)
                          <= tol["atol"] + tol["rtol"] * np.abs(want)), (name, t, e, got_obs, want)
            w = float(f32(row[c["reward"]]))
            assert abs(rew[e] - w) <= tol["reward_atol"] + tol["reward_rtol"] * abs(w), (name, t, e)
            if not (term[e] or trunc[e]):
                ws = f32(row[c["next"]]).astype(np.float64)
                assert np.all(np.abs(nxt[e] - ws) <= tol["atol"] + tol["rtol"] * np.abs(ws)), (name, t, e)
            checked += 1
    assert checked == rows.shape[0]
    envs.close()


def free_run(envs, K):
    """Steps from a seeded reset with record's actions until every env's first episode ended;
    rows as record writes them (next state NaN where the step ended: the vec env has reset it)."""
    got = {i: [] for i in range(K)}
    live = np.ones(K, bool)
    st = envs.state()
    t = 0
    while live.any():
        a = envs.random_actions(t)
        obs, rew, term, trunc, info = envs.step(a)
        st2 = envs.state()
        for i in np.flatnonzero(live):
            done = term[i] or trunc[i]
            fin = info["final_obs"][i] if done else obs[i]
            got[i].append(np.concatenate([[i, t], st[i], np.atleast_1d(a[i]).astype(np.float32),
                                          np.full(st.shape[1], np.nan) if done else st2[i],
                                          np.asarray(fin, np.float32).ravel(), [rew[i], term[i], trunc[i]]]))
            live[i] = not done
        st = st2
        t += 1
    return np.array([r for i in range(K) for r in got[i]])


@pytest.mark.parametrize("name", ["minatar-breakout", "minatar-space-invaders", CORRIDOR])
def test_free_running_transitions_equal_record_bit_for_bit(name, tmp_path):
    head, rows = record(name, str(tmp_path / "rec.csv"), K, SEED)
    envs = lumen.make_vec(name, K, device="cpu", seed=SEED, **params(name))
    envs.reset(seed=SEED)
    got = free_run(envs, K)
    assert got.shape == rows.shape, "episode lengths differ from record's"
    want = f32(rows).astype(np.float64)
    m = ~np.isnan(got)
    assert np.array_equal(got[m], want[m])
    envs.close()
