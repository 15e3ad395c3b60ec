#!/usr/bin/env python3
"""bench/py_vec_bench.py — lumen's vector envs from Python against Gymnasium and gymnax, side by
side in one run, and where the time of a step call goes.

    python bench/py_vec_bench.py [--num-envs 4096] [--steps 200] [--peer-python .venv-peers/bin/python]

Rows (env steps per second, num_envs x steps / seconds of the loop, after a warm-up):
- lumen.make_vec("cartpole", N) stepped from a Python loop with numpy random actions, against
  gymnasium's own vectorised numpy CartPoleVectorEnv(num_envs=N) in the same loop, two ways:
  actions drawn in the loop (rng.integers, which alone costs 15-35 us at 4096), and drawn
  beforehand (a pool of 64 random action arrays, cycled: the loop then times the envs); lumen in
  both auto-reset modes, SAME_STEP (lumen's default: info's final_obs object array) and
  NEXT_STEP (what CartPoleVectorEnv does);
- lumen.make_vec("minatar-breakout", N) in the same loop, against gymnax's Breakout-MinAtar
  env-only rate (vmap over N envs, jit, lax.scan of 256 steps with random actions: no Python per
  step), run by --peer-python (a venv with jax and gymnax; never a test dependency) when given
  or found at .venv-peers/bin/python;
- the store-only bound: build/store_bound (bench/store_bound.c, beside the library) storing
  N x 400 floats a step (memset) and nothing else, on 1 and on 2 threads, the faster counting:
  the most env steps/s any vec env that returns MinAtar's float observations could reach here;
- the Python overhead per step call: the full LumenVectorEnv.step against the bare ctypes call of
  lm_vecenv_step with the same prepared actions and buffers (the C work), at N and at 1 env;
  and the copy of the outputs (lm_program_read into numpy) as the step with and without output
  buffers.
Counts bound the work (steps per row), not time. Prints a table and one JSON line; note the
machine's load (/proc/loadavg, printed) when comparing runs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))  # a checkout's package, when not installed

import lumen  # noqa: E402
from lumen import _lib  # noqa: E402

DEVICE = "cpu"  # --device


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def best_of(reps: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(reps))


def loop_rate(step: Callable[[np.ndarray], Any], n: int, steps: int, sample: Callable[[], np.ndarray],
              reps: int) -> float:
    """Env steps per second of a Python loop: draw random actions, step."""
    for _ in range(5):
        step(sample())

    def once() -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            step(sample())
        return time.perf_counter() - t0

    return n * steps / best_of(reps, once)


def per_call_us(fn: Callable[[], Any], calls: int, reps: int) -> float:
    for _ in range(5):
        fn()

    def once() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - t0

    return best_of(reps, once) / calls * 1e6


def sampler(rng: np.random.Generator, k: int, n: int, drawn: bool) -> Callable[[], np.ndarray]:
    """Random actions: drawn in the loop, or cycled from 64 arrays drawn beforehand."""
    if not drawn:
        return lambda: rng.integers(0, k, size=n)
    pool = [rng.integers(0, k, size=n) for _ in range(64)]
    it = iter(range(1 << 62))
    return lambda: pool[next(it) % 64]


def lumen_rate(env: str, n: int, steps: int, reps: int, rng: np.random.Generator, drawn: bool = False,
               mode: str = "same_step", **params: Any) -> float:
    envs = lumen.make_vec(env, n, device=DEVICE, seed=0, autoreset_mode=mode, **params)
    envs.reset(seed=0)
    r = loop_rate(envs.step, n, steps, sampler(rng, envs.single_action_space.n, n, drawn), reps)
    envs.close()
    return r


def gymnasium_cartpole_rate(n: int, steps: int, reps: int, rng: np.random.Generator, drawn: bool = False) -> float:
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    envs = CartPoleVectorEnv(num_envs=n)
    envs.reset(seed=0)
    r = loop_rate(envs.step, n, steps, sampler(rng, 2, n, drawn), reps)
    envs.close()
    return r


def overhead(env: str, n: int, calls: int, reps: int, mode: str = "same_step") -> Dict[str, float]:
    """Microseconds per call: the whole Python step, the bare ctypes lm_vecenv_step as the step
    makes it (no output buffers where the step reads the programs' own through views, else its
    output buffers), and the bare call with and without output buffers (the output copy,
    lm_program_read). The Python overhead includes, under SAME_STEP, building info's final_obs
    object array for the envs whose episode ended (about num_envs / 22 a step for random
    CartPole)."""
    envs = lumen.make_vec(env, n, device=DEVICE, seed=0, autoreset_mode=mode)
    envs.reset(seed=0)
    # random actions drawn beforehand (so episodes end at their natural, staggered rate), cycled
    rng = np.random.default_rng(1)
    pool = [rng.integers(0, envs.single_action_space.n, size=n) for _ in range(64)]
    it = iter(range(1 << 62))
    pick = lambda: pool[next(it) % 64]  # noqa: E731
    lib = _lib.lib()
    ptr = envs._h.ptr
    none = _lib.VecEnvOut()
    outs = envs._out_ref
    for _ in range(200):  # staggered episodes
        envs.step(pick())
    full = per_call_us(lambda: envs.step(pick()), calls, reps)
    ends = []
    for _ in range(50):
        _, _, term, trunc, _ = envs.step(pick())
        ends.append(term | trunc)
    done = max(ends, key=lambda d: -abs(int(d.sum()) - float(np.mean([e.sum() for e in ends]))))
    info_us = per_call_us(lambda: envs._final_info(done), calls, reps) if done.any() and mode == "same_step" else 0.0
    with_out = per_call_us(lambda: lib.lm_vecenv_step(ptr, pick().ctypes.data, _lib.DTYPE_I64, n, outs), calls, reps)
    no_out = per_call_us(lambda: lib.lm_vecenv_step(ptr, pick().ctypes.data, _lib.DTYPE_I64, n, ctypes.byref(none)),
                         calls, reps)
    bare = no_out if envs._zero_copy else with_out
    copying = lumen.make_vec(env, n, device=DEVICE, seed=0, copy=True, autoreset_mode=mode)
    copying.reset(seed=0)
    for _ in range(200):
        copying.step(pick())
    full_copy = per_call_us(lambda: copying.step(pick()), calls, reps)
    envs.close()
    copying.close()
    return {"step_us": full, "bare_ctypes_us": bare, "python_overhead_us": full - bare, "no_outputs_us": no_out,
            "output_copy_us": with_out - no_out, "step_copy_true_us": full_copy, "final_info_us": info_us,
            "ends_per_step": float(np.mean([e.sum() for e in ends])), "zero_copy": envs._zero_copy}


GYMNAX_CODE = r"""
import json, sys, time
import jax, jax.numpy as jnp, gymnax
n, T, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
env, params = gymnax.make("Breakout-MinAtar")
def run(key):
    key, k0 = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k0, n), params)
    def body(carry, _):
        state, key = carry
        key, ka, ks = jax.random.split(key, 3)
        a = jax.random.randint(ka, (n,), 0, env.num_actions)
        out = jax.vmap(env.step, in_axes=(0, 0, 0, None))(jax.random.split(ks, n), state, a, params)
        state, r = out[1], out[2]  # gymnax 0.0.x returns 5 values, 1.x 6: obs, state, reward, ...
        return (state, key), r.sum()
    (state, key), rs = jax.lax.scan(body, (state, key), None, length=T)
    return rs.sum()
f = jax.jit(run)
t0 = time.perf_counter(); f(jax.random.PRNGKey(0)).block_until_ready(); compile_s = time.perf_counter() - t0
best = 1e30
for i in range(reps):
    t0 = time.perf_counter(); f(jax.random.PRNGKey(i + 1)).block_until_ready(); best = min(best, time.perf_counter() - t0)
print(json.dumps({"sps": n * T / best, "compile_s": compile_s, "jax": jax.__version__, "gymnax": getattr(gymnax, "__version__", "?")}))
"""


def gymnax_breakout_rate(python: str, n: int, steps: int, reps: int) -> Optional[Dict[str, Any]]:
    try:
        p = subprocess.run([python, "-c", GYMNAX_CODE, str(n), str(steps), str(reps)], capture_output=True, text=True,
                           timeout=1800, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"gymnax: cannot run {python}: {e}", file=sys.stderr)
        return None
    if p.returncode != 0:
        print(f"gymnax: {python} failed:\n{p.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def store_bound(n: int, floats: int, threads: int) -> Optional[Dict[str, Any]]:
    """build/store_bound's JSON line, or None (with a note) where it is not beside the library."""
    exe = os.path.join(os.path.dirname(lumen.library_path()), "store_bound")
    if not os.access(exe, os.X_OK):
        print(f"store bound: no {exe} (cmake --build build builds it)", file=sys.stderr)
        return None
    p = subprocess.run([exe, str(n), str(floats), str(threads)], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"store bound: {exe} failed: {p.stderr.strip()}", file=sys.stderr)
        return None
    return json.loads(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-envs", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=200, help="steps per timed loop")
    ap.add_argument("--reps", type=int, default=3, help="timed loops per row (the best counts)")
    ap.add_argument("--peer-python", default=None,
                    help="a python with jax and gymnax for the gymnax row (default: .venv-peers/bin/python if present)")
    ap.add_argument("--gymnax-steps", type=int, default=256, help="steps of gymnax's lax.scan")
    ap.add_argument("--device", default="cpu", help="lumen's backend (cpu, ref, opencl, cuda, auto)")
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    n, steps, reps = a.num_envs, a.steps, a.reps
    rng = np.random.default_rng(0)
    print(f"lumen {lumen.version()} from {lumen.library_path()}; {n} envs, {steps} steps per loop, best of {reps}; "
          f"loadavg before: {loadavg()}")
    res: Dict[str, Any] = {"num_envs": n, "steps": steps, "loadavg_before": loadavg()}
    for drawn, tag in ((False, ""), (True, "_predrawn")):
        res["gymnasium_cartpole_sps" + tag] = gymnasium_cartpole_rate(n, steps, reps, rng, drawn)
        res["lumen_cartpole_sps" + tag] = lumen_rate("cartpole", n, steps, reps, rng, drawn)
        res["lumen_cartpole_next_sps" + tag] = lumen_rate("cartpole", n, steps, reps, rng, drawn, "next_step")
    res["lumen_breakout_sps"] = lumen_rate("minatar-breakout", n, max(steps // 4, 10), reps, rng)
    res["lumen_breakout_next_sps"] = lumen_rate("minatar-breakout", n, max(steps // 4, 10), reps, rng, False,
                                                "next_step")
    peer = a.peer_python or (".venv-peers/bin/python" if os.path.exists(".venv-peers/bin/python") else None)
    gx = gymnax_breakout_rate(peer, n, a.gymnax_steps, reps) if peer else None
    res["gymnax_breakout_sps"] = gx["sps"] if gx else None
    res["gymnax"] = gx
    bounds = [b for b in (store_bound(n, 400, t) for t in (1, 2)) if b]
    res["store_bound"] = max(bounds, key=lambda b: b["sps"]) if bounds else None
    res["overhead_cartpole_N"] = overhead("cartpole", n, steps, reps)
    res["overhead_cartpole_N_next"] = overhead("cartpole", n, steps, reps, "next_step")
    res["overhead_cartpole_1"] = overhead("cartpole", 1, steps * 20, reps)
    res["loadavg_after"] = loadavg()

    def row(name: str, sps: Optional[float], base: Optional[float] = None) -> None:
        if sps is None:
            print(f"  {name:<52} {'-':>12}")
            return
        ratio = f"  {sps / base:6.1f}x" if base else ""
        print(f"  {name:<52} {sps:12.3e}{ratio}")

    print("env steps per second:")
    for tag, how in (("", "actions drawn in the loop"), ("_predrawn", "actions drawn beforehand")):
        g = res["gymnasium_cartpole_sps" + tag]
        row(f"gymnasium CartPoleVectorEnv (next step), {how}", g)
        row(f"lumen 'cartpole', same step, {how}", res["lumen_cartpole_sps" + tag], g)
        row(f"lumen 'cartpole', next step, {how}", res["lumen_cartpole_next_sps" + tag], g)
    row("gymnax Breakout-MinAtar, jit(lax.scan(vmap))", res["gymnax_breakout_sps"])
    row("lumen.make_vec('minatar-breakout'), same step", res["lumen_breakout_sps"], res["gymnax_breakout_sps"])
    row("lumen.make_vec('minatar-breakout'), next step", res["lumen_breakout_next_sps"], res["gymnax_breakout_sps"])
    sb = res["store_bound"]
    row(f"store-only bound, 400 floats an env ({sb['threads'] if sb else '-'} thr, C memset)", sb["sps"] if sb else None,
        res["gymnax_breakout_sps"])
    if gx is None:
        print("  (gymnax: no --peer-python with jax and gymnax; see ../shared/peers/README.md)")
    for key, label in (("overhead_cartpole_N", f"{n} envs, same step"), ("overhead_cartpole_N_next", f"{n} envs, next step"),
                       ("overhead_cartpole_1", "1 env, same step")):
        o = res[key]
        print(f"step call, cartpole, {label}: {o['step_us']:.1f} us in all = {o['bare_ctypes_us']:.1f} us in "
              f"lm_vecenv_step (ctypes{', zero copy' if o['zero_copy'] else ''}) + {o['python_overhead_us']:.1f} us of "
              f"Python; output copy when asked for "
              f"{o['output_copy_us']:.1f} us; with copy=True {o['step_copy_true_us']:.1f} us; of the Python, info's "
              f"final_obs for {o['ends_per_step']:.1f} ended episodes a step {o['final_info_us']:.1f} us")
    print(f"loadavg after: {res['loadavg_after']}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
