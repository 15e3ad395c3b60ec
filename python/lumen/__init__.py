"""lumen from Python: lumen's compiled RL environments as Gymnasium 1.x envs and vector envs, and
lumen's PPO trainer, through ctypes over liblumen (include/lumen/vec.h).

    import lumen
    envs = lumen.make_vec("cartpole", 4096, seed=0)      # a gymnasium.vector.VectorEnv
    env = lumen.make("pendulum")                          # a gymnasium.Env
    run = lumen.train("cartpole", seed=1)                 # lumen's PPO (rltrain's settings)
    policy = lumen.load_policy(run.checkpoint)            # policy.act(obs) -> actions

Where liblumen is found: $LUMEN_LIBRARY, then next to this package, then the build tree of the
checkout it sits in, then the system's library path (see lumen._lib). docs/PYTHON.md has the rest.
"""

from ._env import LumenEnv, make
from ._lib import LumenError, library_path
from ._train import Policy, Run, load_policy, read_run, train
from ._vector import LumenVectorEnv, make_vec

__version__ = "0.1.0"


def version() -> str:
    """liblumen's version (lm_version)."""
    from . import _lib

    v = _lib.lib().lm_version()
    return v.decode() if v else ""


def envs() -> list:
    """The names of the envs registered in liblumen: the built-in ones, then any plugin or env
    registered since in this process (lm_env_count, lm_env_at)."""
    import ctypes

    from . import _lib

    lib = _lib.lib()
    names = []
    for i in range(lib.lm_env_count()):
        info = _lib.VecEnvInfo()
        _lib.check(lib.lm_vecenv_spec_info(lib.lm_env_at(i), ctypes.byref(info)))
        names.append(_lib.text(info.name))
    return names


__all__ = ["make", "make_vec", "train", "load_policy", "read_run", "LumenEnv", "LumenVectorEnv", "Policy", "Run",
           "LumenError", "library_path", "version", "envs"]
