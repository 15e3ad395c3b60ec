"""lumen.train (lumen's PPO through lm_rltrain, in this process) and lumen.load_policy (a
checkpoint's policy as ``act(obs) -> actions``, lm_actor_t)."""

from __future__ import annotations

import csv
import ctypes
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import numpy as np

from . import _lib
from ._lib import LumenError, VecEnvInfo
from ._vector import _env_arg, _seed_arg, params_text, spaces_of

# rltrain's options as keyword settings: name -> option (values), and the flags.
_VALUE_OPTIONS = {
    "device": "--device", "envs": "--envs", "steps": "--steps", "total_steps": "--total-steps", "seed": "--seed",
    "lr": "--lr", "stepper": "--stepper", "gamma": "--gamma", "gae_lambda": "--gae-lambda", "epochs": "--epochs",
    "minibatches": "--minibatches", "clip": "--clip", "clip_coef": "--clip", "ent_coef": "--ent-coef",
    "vf_coef": "--vf-coef", "max_grad_norm": "--max-grad-norm", "hidden": "--hidden", "activation": "--activation",
    "policy": "--policy", "checkpoint_every": "--checkpoint-every", "search_budget": "--search-budget",
    "config": "--config",
}
_FLAG_OPTIONS = {"shared": "--shared", "no_stop": "--no-stop", "exact": "--exact"}
SETTINGS = sorted(list(_VALUE_OPTIONS) + list(_FLAG_OPTIONS) + ["stop", "anneal_lr", "env_params"])


def _number(s: str) -> Union[int, float, str]:
    try:
        return int(s)
    except ValueError:
        try:
            return float(s)
        except ValueError:
            return s


@dataclass
class Run:
    """A finished training run: its directory, checkpoint, log (one dict per iteration, the
    columns of log.csv as numbers), summary (summary.json) and settings (settings.txt)."""

    dir: str
    checkpoint: str
    log: List[Dict[str, Union[int, float]]] = field(default_factory=list)
    summary: Dict[str, Any] = field(default_factory=dict)
    settings: Dict[str, Union[int, float, str]] = field(default_factory=dict)

    @property
    def solved(self) -> bool:
        return bool(self.summary.get("solved", False))

    @property
    def mean_return(self) -> float:
        """Mean return of the last 100 episodes at the end of the run."""
        return float(self.summary.get("mean_return", float("nan")))


def _read_log(path: str) -> List[Dict[str, Union[int, float]]]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]  # type: ignore[misc]


def read_run(run_dir: str) -> Run:
    """The Run of a run directory rltrain wrote."""
    summary: Dict[str, Any] = {}
    sp = os.path.join(run_dir, "summary.json")
    if os.path.exists(sp):
        with open(sp) as f:
            summary = json.load(f)
    settings: Dict[str, Union[int, float, str]] = {}
    tp = os.path.join(run_dir, "settings.txt")
    if os.path.exists(tp):
        with open(tp) as f:
            for line in f:
                if "=" in line:
                    k, v = line.split("=", 1)
                    settings[k.strip()] = _number(v.strip())
    return Run(run_dir, os.path.join(run_dir, "latest.ckpt"), _read_log(os.path.join(run_dir, "log.csv")), summary,
               settings)


def _argv(env: str, out: str, settings: Dict[str, Any]) -> List[str]:
    args: List[str] = []
    for k, v in settings.items():
        if k in _VALUE_OPTIONS:
            if v is None:
                continue
            if isinstance(v, bool):
                raise TypeError(f"lumen.train: {k}={v!r}: expected a value, not a bool")
            if k == "hidden" and isinstance(v, (list, tuple)):
                v = ",".join(str(int(w)) for w in v)
            args += [_VALUE_OPTIONS[k], str(v)]
        elif k in _FLAG_OPTIONS:
            if v:
                args.append(_FLAG_OPTIONS[k])
        elif k == "stop":
            if not v:
                args.append("--no-stop")
        elif k == "anneal_lr":
            if not v:
                args.append("--no-anneal")
        elif k == "env_params":
            text = params_text(v) if isinstance(v, dict) else str(v)
            if text:
                args += ["--env", text]
        else:
            raise TypeError(f"lumen.train: unknown setting {k!r} (settings: {', '.join(SETTINGS)})")
    return ["rltrain", env] + args + ["--out", out]


def _progress_line(row: Dict[str, Union[int, float]]) -> str:
    return (f"iter {row.get('iteration')}: {row.get('env_steps')} steps, {row.get('episodes')} episodes, "
            f"mean return {row.get('mean_return')}, {row.get('sps')} steps/s")


def train(env: Any, *, out: Optional[str] = None, resume: Optional[str] = None, progress: bool = True,
          **settings: Any) -> Run:
    """Trains lumen's PPO on ``env`` (a name or a plugin path) with rltrain's settings and
    defaults, in this process (lm_rltrain), and returns the Run.

    Settings are rltrain's options as keywords (``envs=16, steps=128, total_steps=300000,
    seed=1, lr=2.5e-3, hidden=(64, 64), shared=True, stop=False, anneal_lr=False,
    device="cpu", env_params={"sticky": 0}``...; see ``rltrain ENV --help``). ``out``: the run
    directory (default ``runs/ENV-<time>``); ``resume``: continue a run directory. With
    ``progress`` a line per iteration is printed (from the run's log.csv).
    Bad settings raise ValueError (TypeError for an unknown name) with rltrain's message; a
    failed run raises LumenError.
    """
    name = _env_arg(env)
    if resume is not None:
        out = os.fspath(resume)
    if out is None:
        base = os.path.splitext(os.path.basename(name))[0] if ("/" in name or name.endswith((".c", ".so"))) else name
        out = os.path.join("runs", f"{base}-{time.strftime('%Y%m%d-%H%M%S')}")
    out = os.fspath(out)
    argv = _argv(name, out, settings)
    if resume is not None:
        argv[-2] = "--resume"
    argv.append("--quiet")
    lib = _lib.lib()
    cargv = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    result: Dict[str, int] = {}

    sys.stdout.flush()
    sys.stderr.flush()
    err = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(err.fileno(), 2)  # rltrain's messages, to raise them

    def work() -> None:
        result["rc"] = lib.lm_rltrain(len(argv), cargv)

    th = threading.Thread(target=work, name="lumen.train", daemon=True)
    th.start()
    shown = 0
    log_path = os.path.join(out, "log.csv")
    try:
        while th.is_alive():
            th.join(0.25)
            if progress and os.path.exists(log_path):
                rows = _read_log(log_path)
                for row in rows[shown:]:
                    print(_progress_line(row), flush=True)
                shown = max(shown, len(rows))
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    err.seek(0)
    message = err.read().decode("utf-8", "replace").strip()
    err.close()
    rc = result.get("rc", 1)
    if rc != 0:
        msg = message.replace("rltrain: ", "") or f"rltrain exited with status {rc}"
        if rc == 2:
            raise ValueError(f"lumen.train({name!r}): {msg}")
        raise LumenError(f"lumen.train({name!r}): {msg}", "backend")
    if message:
        print(message, file=sys.stderr)
    run = read_run(out)
    if progress:
        for row in run.log[shown:]:
            print(_progress_line(row))
        s = run.summary
        print(f"{'solved' if run.solved else 'done'}: {s.get('env_steps')} env steps in {s.get('wall_s')} s; "
              f"mean return of the last {s.get('episodes_in_mean')} episodes {s.get('mean_return')} "
              f"(threshold {s.get('threshold')}); checkpoint {run.checkpoint}", flush=True)
    return run


class Policy:
    """A checkpoint's policy (lm_actor_t): ``act(obs)`` gives actions for a batch of
    observations [B, *obs_shape] (or one observation: one action)."""

    def __init__(self, ckpt: Union[str, "os.PathLike[str]"], *, device: str = "auto", seed: int = 0) -> None:
        path = os.fspath(ckpt)
        if not path:
            raise ValueError("lumen.load_policy: no checkpoint given")
        if not isinstance(device, str):
            raise TypeError(f"device must be a string, got {type(device).__name__}")
        self._lib = _lib.lib()
        self._ptr: Optional[int] = self._lib.lm_actor_load(path.encode(), device.encode())
        if not self._ptr:
            raise _lib.fail_null("lumen.load_policy")
        self._lib.lm_actor_set_seed(self._ptr, _seed_arg(seed))
        info = VecEnvInfo()
        _lib.check(self._lib.lm_vecenv_spec_info(self._lib.lm_actor_env(self._ptr), ctypes.byref(info)))
        self.env_name: str = _lib.text(info.name) or ""
        self.params: str = _lib.text(info.params) or ""
        self.observation_space, self.action_space = spaces_of(info)
        self._discrete = bool(info.discrete)
        self._asize = int(info.action_size)

    def act(self, obs: Any, *, greedy: bool = True) -> np.ndarray:
        """Greedy (argmax of the logits, or the mean) or sampled actions: int64 [B] for discrete
        spaces, float32 [B, n] (not clipped) for boxes."""
        if self._ptr is None:
            raise LumenError("act: the policy is closed")
        o = np.ascontiguousarray(obs, dtype=np.float32)
        shape = self.observation_space.shape
        single = o.shape == shape
        if single:
            o = o.reshape((1, *shape))
        if o.ndim != len(shape) + 1 or o.shape[1:] != shape or o.shape[0] < 1:
            raise ValueError(f"{self.env_name} policy: observations of shape {np.shape(obs)}, expected {shape} or "
                             f"(B, {', '.join(map(str, shape))})")
        n = o.shape[0]
        out = np.empty(n * self._asize, dtype=np.float32)
        fp = ctypes.POINTER(ctypes.c_float)
        _lib.check(self._lib.lm_actor_act(self._ptr, n, o.ctypes.data_as(fp), int(bool(greedy)), out.ctypes.data_as(fp)),
                   "act")
        acts = out.astype(np.int64) if self._discrete else out.reshape(n, self._asize)
        return acts[0] if single else acts

    def close(self) -> None:
        if self._ptr is not None:
            self._lib.lm_actor_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def load_policy(ckpt: Union[str, "os.PathLike[str]"], *, device: str = "auto", seed: int = 0) -> Policy:
    """The policy of a checkpoint file or run directory (its latest.ckpt), as ``act(obs)``."""
    return Policy(ckpt, device=device, seed=seed)


__all__ = ["Run", "Policy", "train", "load_policy", "read_run", "SETTINGS"]
