"""``import iree_tools`` for test modules: the planner of :mod:`hal_cpu.iree`
and the program table of :mod:`program_specs` under one name."""

from hal_cpu.iree import *  # noqa: F401,F403
from hal_cpu.iree import __all__ as _iree_all
from program_specs import PROGRAMS, PROGRAMS_DIR, ProgramSpec  # noqa: F401

__all__ = list(_iree_all) + ["PROGRAMS", "PROGRAMS_DIR", "ProgramSpec"]
