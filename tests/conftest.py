"""Shared fixtures: programs compiled by iree-compile once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import iree_tools  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PREBUILT = ROOT / "sample_plugins" / "prebuilt"


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> Path:
    """Directory where compiled programs are cached for the session.

    Set PKR_COMPILE_CACHE to keep them across sessions."""
    env = os.environ.get("PKR_COMPILE_CACHE")
    if env:
        Path(env).mkdir(parents=True, exist_ok=True)
        return Path(env)
    return tmp_path_factory.mktemp("iree-compiled")


@pytest.fixture(scope="session")
def compiled(compile_cache):
    """compiled(program_name, arch) -> iree_tools.Compiled (cached)."""
    def get(program: str, arch: str) -> iree_tools.Compiled:
        return iree_tools.compile_program(iree_tools.PROGRAMS[program].path, arch,
                                          compile_cache)
    return get


@pytest.fixture(scope="session")
def elementwise_so(compiled) -> Path:
    """A real x86_64 executable library (mul_add) as a path."""
    return compiled("mul_add", "x86_64").so_files[0]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
