#!/usr/bin/env python3
"""PPO on CartPole: lumen's rltrain against the PureJaxRL-style peer (jax + gymnax, the whole
training loop one jitted XLA program), side by side in one run, at the same settings.

For each setting and seed, interleaved (lumen, then the peer):
  - training throughput: env steps / training seconds over the same budget (lumen with
    --no-stop, its summary's wall_s, which starts after the graphs are compiled and loaded; the
    peer's train_s, the compiled call);
  - time to solve (the mean of the last 100 episodes >= 475), counting everything a user waits
    for: lumen's process wall until it stops at the threshold; the peer's imports + XLA compile +
    its training time pro-rated to the update where it solved (one XLA call cannot stop early).
The learning rate anneals over the budget in both, so both see the same schedule.

Settings: `cleanrl` (4 envs x 128 steps, lr 2.5e-4, 4 epochs x 4 minibatches) and `lumen`
(lumen's CartPole defaults, read from a run's settings.txt). Medians over the seeds, and the
ratios lumen / peer. Needs the peer's venv (../shared/peers/README.md):

    python3 bench/ppo_vs_purejaxrl.py --python .venv-peers/bin/python [--seeds 3] [--json out.json]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def lumen_defaults(rltrain, tmp):
    out = os.path.join(tmp, "defaults")
    subprocess.run([rltrain, "cartpole", "--total-steps", "1", "--quiet", "--out", out], check=True,
                   stdout=subprocess.DEVNULL)
    kv = {}
    for line in open(os.path.join(out, "settings.txt")):
        if "=" in line:
            k, v = (s.strip() for s in line.split("=", 1))
            kv[k] = v
    shutil.rmtree(out, ignore_errors=True)
    return dict(envs=int(kv["envs"]), steps=int(kv["steps"]), lr=float(kv["lr"]), epochs=int(kv["epochs"]),
                minibatches=int(kv["minibatches"]))


def run_lumen(rltrain, s, seed, budget, tmp, stop):
    out = os.path.join(tmp, "lumen-%d-%d" % (seed, stop))
    cmd = [rltrain, "cartpole", "--seed", str(seed), "--envs", str(s["envs"]), "--steps", str(s["steps"]),
           "--lr", repr(s["lr"]), "--epochs", str(s["epochs"]), "--minibatches", str(s["minibatches"]),
           "--total-steps", str(budget), "--quiet", "--out", out]
    if not stop:
        cmd.append("--no-stop")
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    d = json.load(open(os.path.join(out, "summary.json")))
    shutil.rmtree(out, ignore_errors=True)
    return dict(process_s=wall, train_s=d["wall_s"], env_steps=d["env_steps"], solved=d["solved"])


def run_peer(python, peer, s, seed, budget):
    return peer_result([python, peer, "--seed", str(seed), "--num-envs", str(s["envs"]), "--num-steps",
                        str(s["steps"]), "--lr", repr(s["lr"]), "--epochs", str(s["epochs"]), "--minibatches",
                        str(s["minibatches"]), "--total-timesteps", str(budget)])


def peer_result(cmd):
    """Runs a peer script and returns its RESULT line's JSON, with the process wall as process_s."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.monotonic() - t0
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    d = json.loads(line[len("RESULT "):])
    d["process_s"] = wall
    return d


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the peer's interpreter (with jax and gymnax)")
    ap.add_argument("--peer", default=os.path.join(ROOT, "..", "shared", "peers", "purejaxrl_ppo.py"))
    ap.add_argument("--rltrain", default=os.path.join(ROOT, "build", "rltrain"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=500000, help="env steps of each run (the peer's default)")
    ap.add_argument("--settings", default="cleanrl,lumen")
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args()
    if not os.path.exists(a.peer):
        sys.exit("ppo_vs_purejaxrl: no peer at %s (--peer)" % a.peer)
    if not os.access(a.rltrain, os.X_OK):
        sys.exit("ppo_vs_purejaxrl: no rltrain at %s (build it, or --rltrain)" % a.rltrain)
    tmp = tempfile.mkdtemp(prefix="lumen-vs-xla-")
    settings = {"cleanrl": dict(envs=4, steps=128, lr=2.5e-4, epochs=4, minibatches=4),
                "lumen": lumen_defaults(a.rltrain, tmp)}
    load0 = open("/proc/loadavg").read().split()[:3]
    runs = []
    try:
        for name in a.settings.split(","):
            s = settings[name]
            for seed in range(1, a.seeds + 1):
                thr = run_lumen(a.rltrain, s, seed, a.budget, tmp, stop=False)
                sol = run_lumen(a.rltrain, s, seed, a.budget, tmp, stop=True)
                peer = run_peer(a.python, a.peer, s, seed, a.budget)
                r = dict(setting=name, seed=seed, lumen_sps=thr["env_steps"] / thr["train_s"],
                         peer_sps=peer["sps_train"], lumen_solved=sol["solved"], lumen_solve_s=sol["process_s"],
                         lumen_solve_steps=sol["env_steps"], peer_solved=peer["solved"],
                         peer_solve_steps=peer["solve_env_steps"], peer_import_s=peer["import_s"],
                         peer_compile_s=peer["compile_s"], peer_train_s=peer["train_s"],
                         peer_solve_s=(peer["import_s"] + peer["compile_s"] + peer["solve_s_prorated"]
                                       if peer["solved"] else None))
                runs.append(r)
                print("%-8s seed %d  lumen %8.0f steps/s, solved %s in %.2f s  |  peer %8.0f steps/s, solved %s%s"
                      % (name, seed, r["lumen_sps"], r["lumen_solved"], r["lumen_solve_s"], r["peer_sps"],
                         r["peer_solved"], " in %.2f s" % r["peer_solve_s"] if r["peer_solve_s"] else ""),
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = open("/proc/loadavg").read().split()[:3]
    print("\nmedians over seeds 1..%d, budget %d env steps; load %s -> %s" % (a.seeds, a.budget, " ".join(load0),
                                                                               " ".join(load1)))
    print("| setting | envs x steps, lr, epochs x mb | lumen steps/s | XLA steps/s | ratio | lumen solve s "
          "| XLA solve s (import + compile + train) | ratio | solved lumen / XLA |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in a.settings.split(","):
        rs = [r for r in runs if r["setting"] == name]
        s = settings[name]
        ls, ps = med(r["lumen_sps"] for r in rs), med(r["peer_sps"] for r in rs)
        lt, pt = med(r["lumen_solve_s"] for r in rs), med(r["peer_solve_s"] for r in rs)
        print("| %s | %d x %d, %g, %d x %d | %.0f | %.0f | %.2fx | %.2f | %.2f | %.1fx | %d/%d / %d/%d |"
              % (name, s["envs"], s["steps"], s["lr"], s["epochs"], s["minibatches"], ls, ps, ls / ps, lt, pt,
                 pt / lt, sum(r["lumen_solved"] for r in rs), len(rs), sum(r["peer_solved"] for r in rs), len(rs)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(settings=settings, runs=runs, load=[load0, load1]), f, indent=1)


if __name__ == "__main__":
    main()
