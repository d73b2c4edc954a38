"""The interpreter's op table: op name -> handler, one handler per op.

A handler is called once per op when a function is prepared, with the op's
:class:`~hal_cpu.iree.reader.OpInfo`, and returns ``run(machine, regs)``, or
None when it does not take that form of the op. An op missing here is an
:class:`~hal_cpu.iree.machine.UnsupportedOpError` when the program reaches
it. The handlers live with their dialects:

* :mod:`~hal_cpu.iree.ops_scalar`: ``arith``, ``affine``, value-level ``util``;
* :mod:`~hal_cpu.iree.ops_control`: branches, calls, globals, statuses, ``check``;
* :mod:`~hal_cpu.iree.ops_util`: ``util.buffer`` and ``util.list``;
* :mod:`~hal_cpu.iree.ops_hal`: ``hal``.
"""

from __future__ import annotations

from .ops_control import CONTROL_OPS
from .ops_hal import HAL_OPS
from .ops_scalar import SCALAR_OPS
from .ops_util import UTIL_OPS

__all__ = ["OPS"]

OPS: dict = {}
for _table in (SCALAR_OPS, CONTROL_OPS, UTIL_OPS, HAL_OPS):
    _twice = OPS.keys() & _table.keys()
    if _twice:
        raise RuntimeError(f"ops with two handlers: {sorted(_twice)}")
    OPS.update(_table)
