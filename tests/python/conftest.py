"""Shared helpers of the Python package's tests (tests/python, run by ctest through
cmake/python.cmake in a venv with the package installed; LUMEN_LIBRARY names the build's
liblumen.so and LUMEN_SOURCE_DIR the checkout)."""

import csv
import ctypes
import os
from typing import List, Tuple

import numpy as np
import pytest

import lumen
from lumen import _lib

SOURCE_DIR = os.environ.get("LUMEN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORRIDOR = os.path.join(SOURCE_DIR, "tests", "plugins", "corridor.c")


def rltrain(*args: str) -> int:
    """lm_rltrain in this process: what `rltrain ARGS` does."""
    argv = ["rltrain", *args]
    c = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
    return _lib.lib().lm_rltrain(len(argv), c)


def record(env: str, path: str, episodes: int, seed: int) -> Tuple[List[str], np.ndarray]:
    """`rltrain record ENV PATH --episodes K --seed S`, read back: the header and the rows."""
    assert rltrain("record", env, path, "--episodes", str(episodes), "--seed", str(seed)) == 0
    with open(path, newline="") as f:
        r = csv.reader(f)
        head = next(r)
        rows = np.array([[float(x) for x in row] for row in r], dtype=np.float64)
    return head, rows


@pytest.fixture(scope="session")
def builtin_envs() -> List[str]:
    return lumen.envs()
