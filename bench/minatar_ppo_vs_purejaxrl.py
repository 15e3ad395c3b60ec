#!/usr/bin/env python3
"""PPO on MinAtar (Breakout, Space Invaders): lumen's rltrain against the PureJaxRL-style peer
(../shared/peers/purejaxrl_minatar.py, jax + gymnax, the whole training loop one jitted XLA
program, MinAtar's network with a shared trunk), side by side in one run, at the peer's settings:
minimal action set, no sticky actions, 1000 steps per episode, 64 envs x 128 steps, lr 5e-3
annealed over the budget, 4 epochs x 8 minibatches (lumen's MinAtar defaults are the same; the
env parameters are passed as --env sticky=0,actions=minimal,time_limit=1000).

For each game and seed, interleaved (lumen, then the peer), over the same budget of env steps:
  - training throughput: env steps / training seconds (lumen: its summary's wall_s, which starts
    after the graphs are compiled and loaded; the peer: train_s, the compiled call);
  - the mean return of the last 100 finished episodes at the end of the budget;
  - lumen's process wall (compiles included) and the peer's imports + XLA compile + training.
Medians over the seeds, and the ratios lumen / peer. Needs the peer's venv (../shared/peers/README.md):

    python3 bench/minatar_ppo_vs_purejaxrl.py --python .venv-peers/bin/python [--seeds 3]
        [--budget 2000000] [--games breakout,space-invaders] [--json out.json] [--keep DIR]

--keep DIR keeps lumen's run directories (log.csv, curve.png) under DIR.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from ppo_vs_purejaxrl import med, peer_result

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GAMES = {"breakout": ("minatar-breakout", "Breakout-MinAtar"),
         "space-invaders": ("minatar-space-invaders", "SpaceInvaders-MinAtar")}


def run_lumen(rltrain, env, seed, budget, out):
    cmd = [rltrain, env, "--env", "sticky=0,actions=minimal,time_limit=1000", "--seed", str(seed), "--envs", "64",
           "--steps", "128", "--lr", "0.005", "--epochs", "4", "--minibatches", "8", "--total-steps", str(budget),
           "--no-stop", "--quiet", "--out", out]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    d = json.load(open(os.path.join(out, "summary.json")))
    return dict(process_s=wall, train_s=d["wall_s"], env_steps=d["env_steps"], last100=d["mean_return"])


def run_peer(python, peer, env, seed, budget):
    return peer_result([python, peer, "--env", env, "--trunk", "shared", "--seed", str(seed), "--total-timesteps",
                        str(budget)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the peer's interpreter (with jax and gymnax)")
    ap.add_argument("--peer", default=os.path.join(ROOT, "..", "shared", "peers", "purejaxrl_minatar.py"))
    ap.add_argument("--rltrain", default=os.path.join(ROOT, "build", "rltrain"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=2000000, help="env steps of each run")
    ap.add_argument("--games", default="breakout,space-invaders")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--keep", help="keep lumen's run directories under this directory")
    a = ap.parse_args()
    if not os.path.exists(a.peer):
        sys.exit("minatar_ppo_vs_purejaxrl: no peer at %s (--peer)" % a.peer)
    if not os.access(a.rltrain, os.X_OK):
        sys.exit("minatar_ppo_vs_purejaxrl: no rltrain at %s (build it, or --rltrain)" % a.rltrain)
    games = a.games.split(",")
    for g in games:
        if g not in GAMES:
            sys.exit("minatar_ppo_vs_purejaxrl: unknown game '%s' (breakout, space-invaders)" % g)
    if a.seeds < 1 or a.budget < 8192:
        sys.exit("minatar_ppo_vs_purejaxrl: --seeds must be at least 1 and --budget at least 8192")
    tmp = a.keep or tempfile.mkdtemp(prefix="lumen-minatar-vs-xla-")
    os.makedirs(tmp, exist_ok=True)
    load0 = open("/proc/loadavg").read().split()[:3]
    runs = []
    try:
        for g in games:
            env, peer_env = GAMES[g]
            for seed in range(1, a.seeds + 1):
                lm = run_lumen(a.rltrain, env, seed, a.budget, os.path.join(tmp, "%s-%d" % (env, seed)))
                pr = run_peer(a.python, a.peer, peer_env, seed, a.budget)
                r = dict(game=g, seed=seed, lumen_sps=lm["env_steps"] / lm["train_s"], peer_sps=pr["sps"],
                         lumen_last100=lm["last100"], peer_last100=pr["final_last100"], lumen_train_s=lm["train_s"],
                         lumen_process_s=lm["process_s"], peer_train_s=pr["train_s"], peer_compile_s=pr["compile_s"],
                         peer_import_s=pr["import_s"], peer_process_s=pr["process_s"])
                runs.append(r)
                print("%-14s seed %d  lumen %7.0f steps/s, last100 %6.2f, %6.1f s train  |  peer %7.0f steps/s, "
                      "last100 %6.2f, %6.1f s train + %.1f s compile"
                      % (g, seed, r["lumen_sps"], r["lumen_last100"], r["lumen_train_s"], r["peer_sps"],
                         r["peer_last100"], r["peer_train_s"], r["peer_compile_s"]), flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    load1 = open("/proc/loadavg").read().split()[:3]
    print("\nmedians over seeds 1..%d, budget %d env steps; load %s -> %s" % (a.seeds, a.budget, " ".join(load0),
                                                                               " ".join(load1)))
    print("| game | lumen steps/s | XLA steps/s | ratio | lumen last100 | XLA last100 | ratio | lumen train s "
          "| XLA train s + compile s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for g in games:
        rs = [r for r in runs if r["game"] == g]
        ls, ps = med(r["lumen_sps"] for r in rs), med(r["peer_sps"] for r in rs)
        lr, pr = med(r["lumen_last100"] for r in rs), med(r["peer_last100"] for r in rs)
        print("| %s | %.0f | %.0f | %.2fx | %.2f | %.2f | %.2f | %.1f | %.1f + %.1f |"
              % (g, ls, ps, ls / ps, lr, pr, lr / pr if pr else float("nan"), med(r["lumen_train_s"] for r in rs),
                 med(r["peer_train_s"] for r in rs), med(r["peer_compile_s"] for r in rs)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(runs=runs, load=[load0, load1], budget=a.budget), f, indent=1)


if __name__ == "__main__":
    main()
