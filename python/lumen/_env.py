"""lumen.make: one lumen env as a ``gymnasium.Env`` (the C vector env with num_envs = 1).

A step returns the observation the step reached (where the episode ended, lumen has already
drawn the next episode's start, which ``reset()`` then returns). Every array returned is a fresh
copy, so nothing a caller keeps is overwritten.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Tuple

import gymnasium as gym
import numpy as np

from . import _lib
from ._lib import LumenError, VecEnvInfo, VecEnvOut
from ._vector import _DTYPES, _Handle, _env_arg, _seed_arg, params_text, spaces_of

_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class LumenEnv(gym.Env):
    """A single lumen env with Gymnasium's ``reset``/``step`` API (no auto-reset seen by the
    caller: call ``reset()`` after ``terminated`` or ``truncated``)."""

    metadata: Dict[str, Any] = {"render_modes": []}

    def __init__(self, env: Any, *, device: str = "auto", seed: int = 0, **env_params: Any) -> None:
        name = _env_arg(env)
        if not isinstance(device, str):
            raise TypeError(f"device must be a string, got {type(device).__name__}")
        self._seed = _seed_arg(seed)
        self._h = _Handle(name, params_text(env_params), device, 1, self._seed)
        info = VecEnvInfo()
        _lib.check(self._h.lib.lm_vecenv_get_info(self._h.ptr, ctypes.byref(info)), "lumen.make")
        self._info = info
        self.observation_space, self.action_space = spaces_of(info)
        self.render_mode = None
        self.env_name: str = _lib.text(info.name) or name
        self.device: str = _lib.text(info.device) or device
        self._discrete = bool(info.discrete)
        shape = self.observation_space.shape
        self._obs = np.zeros((1, *shape), dtype=np.float32)
        self._final = np.zeros((1, *shape), dtype=np.float32)
        self._flags = np.zeros((3, 1), dtype=np.float32)
        p = lambda a: a.ctypes.data_as(_FLOAT_P)  # noqa: E731
        self._out = VecEnvOut(p(self._obs), p(self._flags[0]), p(self._flags[1]), p(self._flags[2]), p(self._final))
        self._started = False
        self._act = np.zeros(int(info.action_size), dtype=np.float32)

    def reset(self, *, seed: Optional[int] = None,
              options: Optional[Dict[str, Any]] = None) -> Tuple[np.ndarray, Dict[str, Any]]:
        """Starts an episode: ``seed`` re-keys lumen's streams (and ``self.np_random``); None
        continues them (the first reset uses the seed given to make)."""
        super().reset(seed=seed)
        ptr = self._h.get("reset")
        if options:
            raise ValueError(f"lumen envs take no reset options, got {sorted(options)}")
        reseed = seed is not None or not self._started
        s = _seed_arg(seed) if seed is not None else self._seed
        if seed is not None:
            self._seed = s
        _lib.check(self._h.lib.lm_vecenv_reset(ptr, int(reseed), s, ctypes.byref(self._out)), "reset")
        self._started = True
        return self._obs[0].copy(), {}

    def step(self, action: Any) -> Tuple[np.ndarray, float, bool, bool, Dict[str, Any]]:
        ptr = self._h.get("step")
        a = np.asarray(action)
        if self._discrete:
            if a.shape not in ((), (1,)):
                raise ValueError(f"{self.env_name}: an action of shape {a.shape}, expected a scalar in {self.action_space}")
        elif a.shape != self.action_space.shape:
            raise ValueError(f"{self.env_name}: an action of shape {a.shape}, expected {self.action_space.shape}")
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{self.env_name}: an action of dtype {a.dtype}, expected numbers")
        a = np.ascontiguousarray(a.reshape(-1), dtype=a.dtype if a.dtype in _DTYPES else np.float64)
        _lib.check(self._h.lib.lm_vecenv_step(ptr, a.ctypes.data, _DTYPES[a.dtype], a.size, ctypes.byref(self._out)),
                   "step")
        return (self._final[0].copy(), float(self._flags[0, 0]), bool(self._flags[1, 0] != 0),
                bool(self._flags[2, 0] != 0), {})

    def close(self) -> None:
        """Frees the compiled programs; later calls raise LumenError."""
        self._h.close()

    def __repr__(self) -> str:
        return f"LumenEnv({self.env_name!r}, {'closed' if self._h.ptr is None else self.device})"


def make(env: Any, *, device: str = "auto", seed: int = 0, **env_params: Any) -> LumenEnv:
    """One lumen env as a ``gymnasium.Env`` (see make_vec for the arguments)."""
    return LumenEnv(env, device=device, seed=seed, **env_params)


__all__ = ["LumenEnv", "make", "LumenError"]
