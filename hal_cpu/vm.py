"""Earlier name of :mod:`hal_cpu.programs.vm` (the VM), kept for callers of
``hal_cpu.vm.load_program``, ``hal_cpu.vm.plan_program`` and
``hal_cpu.vm.run_plan``: the same names, nothing else.
"""

from .programs.vm import *  # noqa: F403
from .programs.vm import __all__  # noqa: F401
