"""What a terminator's handler returns to the interpreter's block loop:
``(BR, block_index, values)`` to branch, ``(RET, values)`` to return.

A leaf: the interpreter (:mod:`hal_cpu.iree.machine`) and the handlers
(:mod:`hal_cpu.iree.ops_control`) both import it.
"""

__all__ = ["BR", "RET"]

#: Tags a terminator's handler returns: ``(BR, block_index, values)`` or
#: ``(RET, values)``.
BR, RET = 1, 2
