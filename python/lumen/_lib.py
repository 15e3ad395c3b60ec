"""Finding and binding liblumen (ctypes): the C API of lumen/vec.h, lumen/base.h and lm_rltrain.

The library is looked for, in order:

1. ``$LUMEN_LIBRARY``: the path of ``liblumen.so`` (or of a directory holding it);
2. next to this package: ``lumen/liblumen.so*`` (a wheel or a copy made by hand);
3. the build tree this package sits in: ``<repo>/build*/liblumen.so`` (running from a checkout);
4. the system's library path (``ctypes.util.find_library("lumen")``: an installed prefix on
   ``LD_LIBRARY_PATH`` or in ``ld.so.conf``).

It is loaded with ``RTLD_GLOBAL``: an env plugin that lumen compiles and loads resolves its
``lm_*`` calls against this very library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from ctypes import (POINTER, Structure, c_char_p, c_float, c_int, c_int64, c_size_t, c_uint64,
                    c_void_p)
from typing import List, Optional

LM_MAX_RANK = 8

STATUS_NAMES = ["ok", "invalid", "nomem", "io", "unsupported", "backend", "compile", "corrupt"]

DTYPE_F32, DTYPE_F64, DTYPE_I32, DTYPE_I64 = 0, 1, 2, 3
SAME_STEP, NEXT_STEP = 0, 1  # lm_vec_autoreset


class LumenError(RuntimeError):
    """An error from lumen's C library: ``status`` is its lm_status name ("invalid", "io", ...),
    the message is lumen's own (``lm_last_error``)."""

    def __init__(self, message: str, status: str = "invalid") -> None:
        super().__init__(message)
        self.status = status


class VecEnvInfo(Structure):
    """Mirror of lm_vecenv_info (include/lumen/vec.h)."""

    _fields_ = [
        ("name", c_char_p),
        ("gym_id", c_char_p),
        ("params", c_char_p),
        ("device", c_char_p),
        ("num_envs", c_int64),
        ("state_size", c_int),
        ("obs_size", c_int),
        ("obs_rank", c_int),
        ("obs_shape", c_int * LM_MAX_RANK),
        ("discrete", c_int),
        ("action_n", c_int),
        ("action_size", c_int),
        ("action_low", POINTER(c_float)),
        ("action_high", POINTER(c_float)),
        ("obs_low", POINTER(c_float)),
        ("obs_high", POINTER(c_float)),
        ("time_limit", c_int),
        ("solved_return", c_float),
        ("sticky", c_float),
        ("check_rtol", c_float),
        ("check_atol", c_float),
        ("reward_rtol", c_float),
        ("reward_atol", c_float),
        ("autoreset", c_int),
    ]


class VecEnvOut(Structure):
    """Mirror of lm_vecenv_out."""

    _fields_ = [(n, POINTER(c_float)) for n in ("obs", "reward", "terminated", "truncated", "final_obs")]


def _candidates() -> List[str]:
    out: List[str] = []
    env = os.environ.get("LUMEN_LIBRARY")
    if env:
        out.append(os.path.join(env, "liblumen.so") if os.path.isdir(env) else env)
    here = os.path.dirname(os.path.abspath(__file__))
    out += sorted(glob.glob(os.path.join(here, "liblumen.so*")))
    repo = os.path.dirname(os.path.dirname(here))  # python/lumen -> the checkout
    for d in ["build"] + sorted(os.path.basename(p) for p in glob.glob(os.path.join(repo, "build*"))):
        p = os.path.join(repo, d, "liblumen.so")
        if os.path.exists(p) and p not in out:
            out.append(p)
    found = ctypes.util.find_library("lumen")
    if found:
        out.append(found)
    return out


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_lock = threading.Lock()


def _declare(lib: ctypes.CDLL) -> None:
    def fn(name: str, res, *args) -> None:
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = list(args)

    fn("lm_last_error", c_char_p)
    fn("lm_version", c_char_p)
    fn("lm_vecenv_new", c_void_p, c_char_p, c_char_p, c_char_p, c_int64, c_uint64)
    fn("lm_vecenv_open", c_void_p, c_char_p, c_char_p, c_char_p, c_int64, c_uint64, c_int)
    fn("lm_vecenv_views", c_int, c_void_p, c_int, POINTER(VecEnvOut))
    fn("lm_vecenv_free", None, c_void_p)
    fn("lm_vecenv_get_info", c_int, c_void_p, POINTER(VecEnvInfo))
    fn("lm_vecenv_why", c_char_p, c_void_p)
    fn("lm_vecenv_reset", c_int, c_void_p, c_int, c_uint64, POINTER(VecEnvOut))
    fn("lm_vecenv_step", c_int, c_void_p, c_void_p, c_int, c_size_t, POINTER(VecEnvOut))
    fn("lm_vecenv_random_actions", c_int, c_void_p, c_uint64, POINTER(c_float), c_size_t)
    fn("lm_vecenv_read_state", c_int, c_void_p, POINTER(c_float), c_size_t)
    fn("lm_vecenv_write_state", c_int, c_void_p, POINTER(c_float), c_size_t)
    fn("lm_vecenv_spec_info", c_int, c_void_p, POINTER(VecEnvInfo))
    fn("lm_actor_load", c_void_p, c_char_p, c_char_p)
    fn("lm_actor_free", None, c_void_p)
    fn("lm_actor_env", c_void_p, c_void_p)
    fn("lm_actor_set_seed", None, c_void_p, c_uint64)
    fn("lm_actor_act", c_int, c_void_p, c_size_t, POINTER(c_float), c_int, POINTER(c_float))
    fn("lm_rltrain", c_int, c_int, POINTER(c_char_p))
    fn("lm_env_count", c_int)
    fn("lm_env_at", c_void_p, c_int)


def lib() -> ctypes.CDLL:
    """liblumen, loaded on first use (LumenError when it cannot be found or lacks the API)."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            try:
                cand = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{path}: {e}")
                continue
            try:
                _declare(cand)
            except AttributeError as e:
                tried.append(f"{path}: not a liblumen with the vector-env API ({e})")
                continue
            _lib, _lib_path = cand, path
            return cand
        raise LumenError(
            "cannot find liblumen.so: set LUMEN_LIBRARY to its path (build it with cmake --build BUILD); tried: "
            + ("; ".join(tried) if tried else "nothing found"),
            "io",
        )


def library_path() -> str:
    """The path liblumen was loaded from."""
    lib()
    assert _lib_path is not None
    return _lib_path


def last_error() -> str:
    msg = lib().lm_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status: int, what: str = "") -> None:
    """Raises LumenError with lumen's message when status is not LM_OK."""
    if status != 0:
        name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else str(status)
        msg = last_error() or f"lumen returned status {name}"
        raise LumenError(f"{what}: {msg}" if what else msg, name)


def fail_null(what: str) -> LumenError:
    msg = last_error() or "lumen returned no object"
    return LumenError(f"{what}: {msg}" if what else msg)


def text(s: Optional[bytes]) -> Optional[str]:
    return s.decode("utf-8", "replace") if s is not None else None


def floats(ptr, n: int) -> Optional[List[float]]:
    if not ptr:
        return None
    return [float(ptr[i]) for i in range(n)]


__all__ = ["LumenError", "VecEnvInfo", "VecEnvOut", "lib", "library_path", "check", "last_error"]
