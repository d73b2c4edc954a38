"""Earlier name of :mod:`hal_cpu.programs` (compiler driver, host modules,
the ``check`` module), kept for callers of ``hal_cpu.iree.compile_program``
and ``hal_cpu.iree.HostModule``: every public name of
:mod:`hal_cpu.programs`, looked up there on first use.
"""

from . import programs as _programs

__all__ = list(_programs.__all__)


def __getattr__(name: str):
    return getattr(_programs, name)
