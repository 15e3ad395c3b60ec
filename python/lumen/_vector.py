"""lumen.make_vec: a lumen env as a ``gymnasium.vector.VectorEnv`` over the C vector env
(lumen/vec.h). One ``step`` is one run of the compiled step program; auto-reset happens in the
same step (``AutoresetMode.SAME_STEP``, the default) or in the next (``NEXT_STEP``).

Copies: the actions are converted to float32 once in C (Python passes the array as it is when it
is a C-contiguous float32, float64, int32 or int64 array). On the cpu and ref backends the arrays
``reset`` and ``step`` return are read-only numpy views of the compiled programs' own output
buffers (lm_vecenv_views): nothing is copied. On opencl and cuda the outputs are copied once, by
``lm_program_read``, into numpy arrays this object owns (a device-to-host transfer). Either way,
with ``copy=False`` (the default) the next call overwrites them (with views: the next ``step``
overwrites what a step returned, the next ``reset`` what a reset returned): copy what you keep
(``obs.copy()``). ``copy=True`` returns fresh arrays. Views keep the C env's memory alive, so an
array outlives ``close``.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from . import _lib
from ._lib import LumenError, VecEnvInfo, VecEnvOut

_FLOAT_P = ctypes.POINTER(ctypes.c_float)

_DTYPES = {np.dtype(np.float32): _lib.DTYPE_F32, np.dtype(np.float64): _lib.DTYPE_F64,
           np.dtype(np.int32): _lib.DTYPE_I32, np.dtype(np.int64): _lib.DTYPE_I64}


def params_text(env_params: Dict[str, Any]) -> str:
    """lm_env_configure's text for keyword parameters (time_limit=1000, sticky=0, actions="minimal")."""
    items = []
    for k, v in env_params.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise TypeError(f"env parameter names are identifiers, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise TypeError(f"env parameter {k}={v!r}: expected a number or a string")
        s = repr(v) if isinstance(v, float) else str(v)
        if "," in s or "=" in s:
            raise ValueError(f"env parameter {k}={v!r}: a value holds no ',' or '='")
        items.append(f"{k}={s}")
    return ",".join(items)


def _env_arg(env: Any) -> str:
    if isinstance(env, (str, bytes)) or hasattr(env, "__fspath__"):
        import os

        s = os.fsdecode(env)
        if not s:
            raise ValueError("env is empty: give a name such as 'cartpole' or a plugin path 'path/to/env.c'")
        return s
    raise TypeError(f"env must be a name or a path, got {type(env).__name__}")


def _seed_arg(seed: Any, what: str = "seed") -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(seed).__name__}")
    s = int(seed)
    if s < 0 or s >= 1 << 64:
        raise ValueError(f"{what} = {s} is outside 0 .. 2**64 - 1")
    return s


def _autoreset_arg(mode: Any) -> AutoresetMode:
    if isinstance(mode, AutoresetMode):
        if mode in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
            return mode
    elif isinstance(mode, str):
        for m in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
            if mode.lower() in (m.value.lower(), m.name.lower()):
                return m
    raise ValueError(f"autoreset_mode={mode!r}: lumen's vector envs take AutoresetMode.SAME_STEP or NEXT_STEP "
                     "('same_step', 'next_step')")


def spaces_of(info: VecEnvInfo) -> Tuple[gym.spaces.Box, gym.Space]:
    """The single observation and action spaces of an env."""
    shape = tuple(info.obs_shape[k] for k in range(info.obs_rank)) if info.obs_rank else (info.obs_size,)
    if info.obs_low:
        low = np.array(_lib.floats(info.obs_low, info.obs_size), dtype=np.float32).reshape(shape)
        high = np.array(_lib.floats(info.obs_high, info.obs_size), dtype=np.float32).reshape(shape)
    else:
        low = np.full(shape, -np.inf, dtype=np.float32)
        high = np.full(shape, np.inf, dtype=np.float32)
    obs_space = gym.spaces.Box(low, high, shape=shape, dtype=np.float32)
    if info.discrete:
        act: gym.Space = gym.spaces.Discrete(info.action_n)
    else:
        alow = np.array(_lib.floats(info.action_low, info.action_n), dtype=np.float32)
        ahigh = np.array(_lib.floats(info.action_high, info.action_n), dtype=np.float32)
        act = gym.spaces.Box(alow, ahigh, shape=(info.action_n,), dtype=np.float32)
    return obs_space, act


class _Memory:
    """The lm_vecenv_t itself, freed when nothing refers to it: the handle until it is closed,
    and every numpy view of its buffers (so a view never outlives the memory it reads)."""

    def __init__(self, lib: ctypes.CDLL, ptr: int) -> None:
        self.lib, self.ptr = lib, ptr

    def __del__(self) -> None:
        if self.ptr:
            self.lib.lm_vecenv_free(self.ptr)
            self.ptr = 0


class _Handle:
    """Owns one lm_vecenv_t; closing it twice is harmless."""

    def __init__(self, env: str, params: str, device: str, num_envs: int, seed: int, autoreset: int = 0) -> None:
        lib = _lib.lib()
        self.lib = lib
        ptr = lib.lm_vecenv_open(env.encode(), params.encode() or None, device.encode(), num_envs, seed, autoreset)
        if not ptr:
            raise _lib.fail_null(f"lumen.make_vec({env!r})")
        self.ptr: Optional[int] = ptr
        self.memory: Optional[_Memory] = _Memory(lib, ptr)

    def get(self, what: str) -> int:
        if not self.ptr:
            raise LumenError(f"{what}: the env is closed", "invalid")
        return self.ptr

    def view(self, p: Any, shape: Tuple[int, ...]) -> Optional[np.ndarray]:
        """A read-only float32 array over n floats at C pointer p (None for NULL), keeping the
        env's memory alive."""
        if not p:
            return None
        n = int(np.prod(shape))
        buf = (ctypes.c_float * n).from_address(ctypes.addressof(p.contents))
        buf._lumen_memory = self.memory  # type: ignore[attr-defined]
        a = np.frombuffer(buf, dtype=np.float32).reshape(shape)
        a.flags.writeable = False
        return a

    def close(self) -> None:
        self.ptr = None
        self.memory = None  # freed now, or when the last view goes

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class LumenVectorEnv(VectorEnv):
    """``num_envs`` copies of a lumen env stepped together by one compiled program.

    Gymnasium 1.x semantics: ``reset(seed=..., options=None) -> (obs, info)``,
    ``step(actions) -> (obs, reward, terminated, truncated, info)``, and the auto-reset mode
    ``metadata["autoreset_mode"]``:

    - ``AutoresetMode.SAME_STEP`` (the default): where an episode ended, ``obs`` is the next
      episode's first observation and ``info["final_obs"]`` (an object array, ``None`` where
      ``info["_final_obs"]`` is False) holds the observation the step reached;
      ``info["final_info"]`` and ``info["_final_info"]`` are as Gymnasium's SyncVectorEnv gives
      them (lumen's envs have no per-step info, so ``final_info`` is ``{}``).
    - ``AutoresetMode.NEXT_STEP`` (Gymnasium's own vector envs' default): ``obs`` is what the
      step reached; the next step resets the envs whose episode ended, ignoring their actions,
      and gives their first observation with reward 0 and both flags False. ``info`` is ``{}``.

    Observations and rewards are float32 (lumen's own; Gymnasium's CartPoleVectorEnv gives
    float32 rewards too), terminated and truncated bool.
    """

    metadata: Dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env: Any, num_envs: int, *, device: str = "auto", seed: int = 0, copy: bool = False,
                 autoreset_mode: Union[AutoresetMode, str] = AutoresetMode.SAME_STEP, **env_params: Any) -> None:
        name = _env_arg(env)
        if isinstance(num_envs, (bool, np.bool_)) or not isinstance(num_envs, (int, np.integer)):
            raise TypeError(f"num_envs must be an int, got {type(num_envs).__name__}")
        if not isinstance(device, str):
            raise TypeError(f"device must be a string ('auto', 'cpu', 'ref', 'opencl', ...), got {type(device).__name__}")
        n = int(num_envs)
        if n < 1:
            raise ValueError(f"num_envs = {n}: need at least one env")
        self._seed = _seed_arg(seed)
        mode = _autoreset_arg(autoreset_mode)
        self.metadata = dict(type(self).metadata, autoreset_mode=mode)
        self._next_step = mode == AutoresetMode.NEXT_STEP
        self._h = _Handle(name, params_text(env_params), device, n, self._seed,
                          _lib.NEXT_STEP if self._next_step else _lib.SAME_STEP)
        info = VecEnvInfo()
        _lib.check(self._h.lib.lm_vecenv_get_info(self._h.ptr, ctypes.byref(info)), "lumen.make_vec")
        self._info = info
        self.num_envs = n
        self.single_observation_space, self.single_action_space = spaces_of(info)
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self.copy = bool(copy)
        self.render_mode = None
        self.env_name: str = _lib.text(info.name) or name
        self.device: str = _lib.text(info.device) or device
        self.device_why: str = _lib.text(self._h.lib.lm_vecenv_why(self._h.ptr)) or self.device
        self.gym_id: Optional[str] = _lib.text(info.gym_id)
        self.params: str = _lib.text(info.params) or ""
        self.time_limit: int = int(info.time_limit)
        self._discrete = bool(info.discrete)
        self._asize = int(info.action_size)
        self._action_shape: Tuple[int, ...] = (n,) if self._discrete else (n, int(info.action_n))
        obs_shape = self.single_observation_space.shape
        self._obs = np.zeros((n, *obs_shape), dtype=np.float32)
        self._final = np.zeros((n, *obs_shape), dtype=np.float32)
        self._flags = np.zeros((3, n), dtype=np.float32)  # reward, terminated, truncated
        self._out = VecEnvOut(self._ptr(self._obs), self._ptr(self._flags[0]), self._ptr(self._flags[1]),
                              self._ptr(self._flags[2]), self._ptr(self._final))
        self._out_ref = ctypes.byref(self._out)
        self._views = [a.view() for a in (self._obs, self._final, self._flags[0])]
        for a in self._views:
            a.flags.writeable = False
        # zero copy where the backend's buffers are host memory: views of the programs' outputs
        sv, rv = VecEnvOut(), VecEnvOut()
        _lib.check(self._h.lib.lm_vecenv_views(self._h.ptr, 1, ctypes.byref(sv)), "lumen.make_vec")
        _lib.check(self._h.lib.lm_vecenv_views(self._h.ptr, 0, ctypes.byref(rv)), "lumen.make_vec")
        self._zero_copy = bool(sv.obs) and bool(rv.obs)
        if self._zero_copy:
            h, shape = self._h, (n, *obs_shape)
            self._s_obs, self._s_rew = h.view(sv.obs, shape), h.view(sv.reward, (n,))
            self._s_term, self._s_trunc = h.view(sv.terminated, (n,)), h.view(sv.truncated, (n,))
            self._s_final = h.view(sv.final_obs, shape)  # None under NEXT_STEP
            self._r_obs = h.view(rv.obs, shape)
            self._none_ref = ctypes.byref(VecEnvOut())
        self._started = False
        self.closed = False

    @staticmethod
    def _ptr(a: np.ndarray) -> Any:
        return a.ctypes.data_as(_FLOAT_P)

    # ---------------------------------------------------------------- reset / step

    def reset(self, *, seed: Optional[Union[int, Sequence[Optional[int]]]] = None,
              options: Optional[Dict[str, Any]] = None) -> Tuple[np.ndarray, Dict[str, Any]]:
        """Starts every env's episode. ``seed``: an int re-keys the random streams (env i starts
        where ``rltrain record --seed S`` starts its episode i); None continues them (the first
        reset uses the seed given to make_vec). A list of per-env seeds is refused: lumen's envs
        share one key."""
        ptr = self._h.get("reset")
        if options:
            raise ValueError(f"lumen vector envs take no reset options, got {sorted(options)}")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise TypeError("seed must be an int or None (lumen's envs share one key: per-env seeds are not supported),"
                            f" got {type(seed).__name__}")
        reseed = seed is not None or not self._started
        s = _seed_arg(seed) if seed is not None else self._seed
        if seed is not None:
            self._seed = s
        _lib.check(self._h.lib.lm_vecenv_reset(ptr, int(reseed), s, self._none_ref if self._zero_copy else self._out_ref),
                   "reset")
        self._started = True
        view = self._r_obs if self._zero_copy else self._views[0]
        return (view.copy() if self.copy else view), {}

    def _actions(self, actions: Any) -> Tuple[np.ndarray, int]:
        a = actions if isinstance(actions, np.ndarray) else np.asarray(actions)
        if a.shape != self._action_shape:
            if a.size == int(np.prod(self._action_shape)) and a.ndim <= len(self._action_shape) + 1 and (
                    a.shape == self._action_shape + (1,)):
                a = a.reshape(self._action_shape)
            else:
                raise ValueError(f"{self.env_name}: actions of shape {a.shape}, expected {self._action_shape} "
                                 f"(action space {self.action_space})")
        code = _DTYPES.get(a.dtype)
        if code is None:
            if a.dtype.kind in "biu":
                a, code = a.astype(np.int64), _lib.DTYPE_I64
            elif a.dtype.kind == "f":
                a, code = a.astype(np.float32), _lib.DTYPE_F32
            else:
                raise TypeError(f"{self.env_name}: actions of dtype {a.dtype}, expected numbers")
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        return a, code

    def step(self, actions: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Dict[str, Any]]:
        """One step of every env; see the class for what comes back. A bad action (shape, type,
        value outside the action space, non-finite) raises with lumen's message naming it."""
        ptr = self._h.get("step")
        a, code = self._actions(actions)
        if self._zero_copy:
            _lib.check(self._h.lib.lm_vecenv_step(ptr, a.ctypes.data, code, a.size, self._none_ref), "step")
            # flags are 0 or 1: astype is the cheapest test (1.2 us at 4096 against 1.9 for != 0)
            obs, rew, term, trunc = self._s_obs, self._s_rew, self._s_term.astype(bool), self._s_trunc.astype(bool)
        else:
            _lib.check(self._h.lib.lm_vecenv_step(ptr, a.ctypes.data, code, a.size, self._out_ref), "step")
            flags = self._flags
            obs, rew, term, trunc = self._views[0], self._views[2], flags[1] != 0, flags[2] != 0
        info: Dict[str, Any] = {}
        if not self._next_step:
            done = term | trunc
            if done.any():
                info = self._final_info(done)
        if self.copy:
            obs, rew = obs.copy(), rew.copy()
        return obs, rew, term, trunc, info

    def _final_info(self, done: np.ndarray) -> Dict[str, Any]:
        """SyncVectorEnv's SAME_STEP info: final_obs an object array (None where no episode
        ended), its mask, and empty final_info with its mask."""
        idx = np.flatnonzero(done)
        fo = np.empty(self.num_envs, dtype=object)
        final = self._s_final if self._zero_copy else self._final
        rows = final[idx]  # a copy: the buffer is overwritten by the next step
        try:
            fo[idx] = list(rows)  # numpy puts each row array into its slot
            ok = fo[idx[0]].shape == rows.shape[1:]
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            fo = np.empty(self.num_envs, dtype=object)
            for j, i in enumerate(idx):
                fo[i] = rows[j]
        return {"final_obs": fo, "_final_obs": done, "final_info": {}, "_final_info": done.copy()}

    # ---------------------------------------------------------------- extras

    def random_actions(self, k: int) -> np.ndarray:
        """``rltrain record``'s uniform random actions for step k under the current seed:
        env i's action is lm_env_ref_random_action(env, seed, i, k)."""
        ptr = self._h.get("random_actions")
        out = np.empty(self.num_envs * self._asize, dtype=np.float32)
        _lib.check(self._h.lib.lm_vecenv_random_actions(ptr, _seed_arg(k, "k"), self._ptr(out), out.size),
                   "random_actions")
        out = out.reshape(self._action_shape)
        return out.astype(np.int64) if self._discrete else out

    def state(self) -> np.ndarray:
        """The envs' state after the last reset or step, [num_envs, state_size] (the env's own layout)."""
        ptr = self._h.get("state")
        out = np.empty((self.num_envs, int(self._info.state_size)), dtype=np.float32)
        _lib.check(self._h.lib.lm_vecenv_read_state(ptr, self._ptr(out), out.size), "state")
        return out

    def set_state(self, state: Any) -> None:
        """Replaces the envs' state ([num_envs, state_size]; the step counters stay): for
        replaying recorded transitions one step each."""
        ptr = self._h.get("set_state")
        s = np.ascontiguousarray(state, dtype=np.float32)
        want = (self.num_envs, int(self._info.state_size))
        if s.shape != want:
            raise ValueError(f"{self.env_name}: a state of shape {s.shape}, expected {want}")
        _lib.check(self._h.lib.lm_vecenv_write_state(ptr, self._ptr(s), s.size), "set_state")

    @property
    def tolerances(self) -> Dict[str, float]:
        """`rltrain check`'s tolerances between the env's graph and its reference stepper."""
        i = self._info
        return {"rtol": float(i.check_rtol), "atol": float(i.check_atol), "reward_rtol": float(i.reward_rtol),
                "reward_atol": float(i.reward_atol)}

    def close_extras(self, **kwargs: Any) -> None:
        self._h.close()

    def close(self, **kwargs: Any) -> None:
        """Frees the compiled programs; later calls raise LumenError, a second close does nothing.
        Arrays already returned stay valid (numpy owns them)."""
        self._h.close()
        self.closed = True

    def __repr__(self) -> str:
        state = "closed" if self._h.ptr is None else self.device
        return f"LumenVectorEnv({self.env_name!r}, num_envs={self.num_envs}, {state})"


def make_vec(env: Any, num_envs: int, *, device: str = "auto", seed: int = 0, copy: bool = False,
             autoreset_mode: Union[AutoresetMode, str] = AutoresetMode.SAME_STEP, **env_params: Any) -> LumenVectorEnv:
    """A lumen env as a Gymnasium vector env of ``num_envs`` copies.

    ``env``: a built-in name ("cartpole", "minatar-breakout", ...), a Gymnasium id
    ("CartPole-v1") or a plugin file ("path/to/env.c" or ".so"). ``device``: "auto", "cpu",
    "ref", "opencl", "cuda". ``seed``: the key of the first reset without a seed.
    ``autoreset_mode``: ``AutoresetMode.SAME_STEP`` (or "same_step") or ``NEXT_STEP``
    ("next_step"); see LumenVectorEnv. Under NEXT_STEP an ended episode's reset draws at the step
    that performs it, so its episodes differ from SAME_STEP's and ``rltrain record``'s after the
    first. ``env_params``: lumen's env parameters (``time_limit=1000, sticky=0,
    actions="minimal"``).
    """
    return LumenVectorEnv(env, num_envs, device=device, seed=seed, copy=copy, autoreset_mode=autoreset_mode,
                          **env_params)
