#!/usr/bin/env python3
"""MinAtar env-only steps/s, lumen's compiled envs against gymnax on the CPU, side by side.

Each round runs ../shared/peers/gymnax_minatar_envbench.py (jax.vmap + jit + lax.scan, random
actions, 4096 envs x 256 steps, gymnax's minimal action sets, no sticky actions) and then
`rlbench --only envs --env-list minatar-breakout,minatar-space-invaders` at the same envs and
steps and at gymnax's settings (`--env-params sticky=0,actions=minimal,time_limit=1000`: its
minimal action sets, no sticky actions, max_steps_in_episode 1000); `--lumen-defaults` runs lumen
with MinAtar's own instead (all 6 actions, sticky actions 0.1: one more random draw per env step,
no time limit). Rounds alternate so both see the same load; the table gives the medians over
rounds of each run's median, and the ratio lumen / gymnax (issue 23 asks for 20x).

  .venv-peers/bin/python bench/minatar_envs_vs_gymnax.py [--rounds 3] [--rlbench build/rlbench]

The python running this script must have jax and gymnax (the peers' set-up in
../shared/peers/README.md); rlbench needs only the build.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PAIRS = [("minatar-breakout", "Breakout-MinAtar"), ("minatar-space-invaders", "SpaceInvaders-MinAtar")]


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_gymnax(script, envs, steps):
    out = subprocess.run([sys.executable, script, "--envs", str(envs), "--steps", str(steps), "--reps", "3",
                          "--rand-envs", "64", "--env"] + [g for _, g in PAIRS],
                         capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            res[r["env"]] = r["sps_median"]
    return res


GYMNAX_SETTINGS = "sticky=0,actions=minimal,time_limit=1000"


def run_lumen(rlbench, envs, steps, params):
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "envs.json")
        subprocess.run([rlbench, "--only", "envs", "--env-list", ",".join(l for l, _ in PAIRS), "--envs", str(envs),
                        "--env-steps", str(steps), "--json", js] + (["--env-params", params] if params else []),
                       capture_output=True, text=True, check=True)
        with open(js) as f:
            doc = json.load(f)
    res = {}
    for r in doc["results"]:
        if r.get("bench") == "envs" and r.get("variant", "").startswith("compiled"):
            res[(r["env"], int(r["threads"]))] = r["steps_per_s"]
    return res


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--envs", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--rlbench", default=os.path.join(here, "..", "build", "rlbench"))
    ap.add_argument("--gymnax-script", default=os.path.join(here, "..", "..", "shared", "peers",
                                                            "gymnax_minatar_envbench.py"))
    ap.add_argument("--lumen-defaults", action="store_true",
                    help="run lumen with MinAtar's own settings, not gymnax's")
    a = ap.parse_args()
    params = None if a.lumen_defaults else GYMNAX_SETTINGS
    if a.rounds < 1:
        sys.exit("minatar_envs_vs_gymnax: --rounds must be at least 1")
    for path, what in ((a.rlbench, "rlbench"), (a.gymnax_script, "the gymnax peer")):
        if not os.path.exists(path):
            sys.exit(f"minatar_envs_vs_gymnax: {what} not found at {path}")
    gym, lum, loads = {}, {}, [loadavg()]
    for k in range(a.rounds):
        for env, sps in run_gymnax(a.gymnax_script, a.envs, a.steps).items():
            gym.setdefault(env, []).append(sps)
        for key, sps in run_lumen(a.rlbench, a.envs, a.steps, params).items():
            lum.setdefault(key, []).append(sps)
        loads.append(loadavg())
        print(f"round {k + 1}/{a.rounds} done, 1-min load {loads[-1]:.2f}", file=sys.stderr)
    med = statistics.median
    print(f"MinAtar env-only steps/s, {a.envs} envs x {a.steps} steps, medians of {a.rounds} rounds "
          f"(1-min load {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} CPUs); lumen's env parameters: "
          f"{params or 'MinAtar defaults'}")
    print(f"  {'env':24s} {'gymnax':>10s} {'lumen thr':>10s} {'lumen':>10s} {'x gymnax':>9s}")
    for lname, gname in PAIRS:
        g = med(gym[gname]) if gname in gym else float("nan")
        for (env, thr), v in sorted(lum.items()):
            if env == lname:
                print(f"  {lname:24s} {g:10.3e} {thr:10d} {med(v):10.3e} {med(v) / g:8.1f}x")


if __name__ == "__main__":
    main()
