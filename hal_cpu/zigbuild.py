"""Earlier name of :mod:`hal_cpu.buildtools.zig`, kept for callers of
``hal_cpu.zigbuild.build_plugin`` and ``hal_cpu.zigbuild.select_profile``:
the same public names.
"""

from .buildtools.zig import *  # noqa: F403
from .buildtools.zig import __all__  # noqa: F401
