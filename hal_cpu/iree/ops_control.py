"""Handlers for control flow, calls, globals, statuses and the ``check`` ops.

``cf.br`` / ``cf.cond_br`` / ``cf.switch`` and ``util.return`` end a block;
``util.call`` runs a function of the program or an import (a host module's
function, linked by :meth:`hal_cpu.iree.host_modules.ModuleRegistry.link`);
``check.expect_*`` call the ``check`` host module as IREE's compiler makes
them call its runtime module.
"""

from __future__ import annotations

from .control import BR, RET
from .errors import EvaluationError
from .scalars import float_dtype, int_width, round_float, wrap

__all__ = ["CONTROL_OPS", "global_initial_value", "ProgramStatusError", "STATUS_NAMES"]

#: IREE status codes (``iree_status_code_t``) by value.
STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
    "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED", "DEFERRED", "INCOMPATIBLE",
)


class ProgramStatusError(EvaluationError):
    """The program itself failed (``util.status.check_ok`` of a non-OK
    status, ``util.unreachable``): ``status`` is IREE's status name."""

    status = "UNKNOWN"


def _ir():
    from iree.compiler import ir
    return ir


def global_initial_value(g):
    """The interpreter's value of a ``util.global``'s initial value.

    Raises:
        EvaluationError: an initial value of another kind.
    """
    ir = _ir()
    attr, ty = g.initial, g.type
    w = int_width(ty)
    if w is not None and isinstance(attr, (ir.IntegerAttr, ir.BoolAttr)):
        return wrap(int(attr.value), w)
    if float_dtype(ty) is not None and isinstance(attr, ir.FloatAttr):
        return round_float(attr.value, ty)
    if ty == "!hal.device":
        # a host-only program names its device by target: this runtime is it
        from .device import Handle
        return Handle("device")
    raise EvaluationError(f"global @{g.name} has an initial value the interpreter "
                          f"does not take: {attr}", path=g.where.path,
                          line=g.where.line or None, op="util.global")


def _return(op):
    ins = op.operands

    def run(m, r):
        return (RET, [r[i] for i in ins])
    return run


def _br(op):
    (dest,) = op.successors
    ins = op.operands

    def run(m, r):
        return (BR, dest, [r[i] for i in ins])
    return run


def _cond_br(op):
    v = op.view
    cond = op.slot(v.condition)
    t_args = [op.slot(x) for x in v.trueDestOperands]
    f_args = [op.slot(x) for x in v.falseDestOperands]
    t_dest, f_dest = op.successors

    def run(m, r):
        if r[cond]:
            return (BR, t_dest, [r[i] for i in t_args])
        return (BR, f_dest, [r[i] for i in f_args])
    return run


def _switch(op):
    ir = _ir()
    v = op.view
    flag = op.slot(v.flag)
    w = int_width(str(v.flag.type)) or 64
    values = [wrap(int(x), w) for x in ir.DenseIntElementsAttr(op.attr("case_values"))] \
        if op.attr("case_values") is not None else []
    default_args = [op.slot(x) for x in v.defaultOperands]
    segments = list(ir.DenseI32ArrayAttr(op.attr("case_operand_segments")))
    case_ops = [op.slot(x) for x in v.caseOperands]
    case_args, k = [], 0
    for n in segments:
        case_args.append(case_ops[k:k + n])
        k += n
    default_dest, *case_dests = op.successors
    table = {val: (dest, args) for val, dest, args in zip(values, case_dests, case_args)}

    def run(m, r):
        dest, args = table.get(r[flag], (default_dest, default_args))
        return (BR, dest, [r[i] for i in args])
    return run


def _call(op):
    ir = _ir()
    callee = ir.FlatSymbolRefAttr(op.attr("callee")).value
    ins, outs = op.operands, op.results

    def run(m, r):
        args = [r[i] for i in ins]
        fn = m.program.functions.get(callee)
        if fn is not None:
            vals = m.run(fn, args)
        else:
            linked = m.imports.get(callee)
            if linked is None:
                raise EvaluationError(f"util.call @{callee}: the program neither defines "
                                      "nor declares it")
            vals = linked(m, args)
        if len(vals) != len(outs):
            raise EvaluationError(f"@{callee} returned {len(vals)} values; the call "
                                  f"takes {len(outs)}")
        for o, v in zip(outs, vals):
            r[o] = v
    return run


def _global_load(op):
    ir = _ir()
    name = ir.FlatSymbolRefAttr(op.attr("global")).value
    (out,) = op.results

    def run(m, r):
        try:
            r[out] = m.globals[name]
        except KeyError:
            if name not in m.program.globals:
                raise EvaluationError(f"global @{name} is not declared") from None
            raise EvaluationError(f"global @{name} is read before any initializer "
                                  "stores it") from None
    return run


def _global_store(op):
    ir = _ir()
    name = ir.FlatSymbolRefAttr(op.attr("global")).value
    (value,) = op.operands

    def run(m, r):
        m.globals[name] = r[value]
    return run


def _message(op) -> str:
    a = op.attr("message")
    return _ir().StringAttr(a).value if a is not None else ""


def _check_ok(op):
    (status,) = op.operands[:1]
    message = _message(op)

    def run(m, r):
        code = r[status] & 0x1F
        if code:
            name = STATUS_NAMES[code] if code < len(STATUS_NAMES) else str(code)
            err = ProgramStatusError(f"{name}; {message}" if message else name)
            err.status = name
            raise err
    return run


def _unreachable(op):
    message = _message(op)

    def run(m, r):
        raise ProgramStatusError(f"unreachable code reached: {message}")
    return run


def _noop(op):
    def run(m, r):
        pass
    return run


# -- the check module's ops ----------------------------------------------------

def _check(function: str, attrs: tuple[tuple[str, float], ...] = ()):
    """``check.<function>`` with its operands (the device operand dropped) and
    its float attributes (e.g. ``atol``, with their defaults) as arguments."""
    def build(op):
        ir = _ir()
        ins = [s for s, t in zip(op.operands, op.operand_types) if t != "!hal.device"]
        types = [t for t in op.operand_types if t != "!hal.device"]
        extra = []
        for name, default in attrs:
            a = op.attr(name)
            extra.append(ir.FloatAttr(a).value if a is not None else default)

        def run(m, r):
            m.modules.call_builtin(m, "check", function, [r[i] for i in ins] + extra,
                                   types + ["f32"] * len(extra))
        return run
    return build


CONTROL_OPS = {
    "util.return": _return,
    "cf.br": _br,
    "cf.cond_br": _cond_br,
    "cf.switch": _switch,
    "util.call": _call,
    "util.global.load": _global_load,
    "util.global.store": _global_store,
    "util.status.check_ok": _check_ok,
    "util.unreachable": _unreachable,
    "util.scf.unreachable": _unreachable,
    "check.expect_true": _check("expect_true"),
    "check.expect_false": _check("expect_false"),
    "check.expect_all_true": _check("expect_all_true"),
    "check.expect_eq": _check("expect_eq"),
    "check.expect_almost_eq": _check("expect_almost_eq",
                                     (("atol", 1e-4), ("rtol", 0.0))),
}

# ops that only order or annotate work the interpreter runs in order anyway
for _name in ("hal.command_buffer.execution_barrier", "hal.command_buffer.finalize",
              "hal.command_buffer.begin_debug_group", "hal.command_buffer.end_debug_group",
              "hal.device.queue.barrier", "hal.device.queue.flush", "hal.fence.signal",
              "hal.buffer.assert", "hal.device.queue.dealloca",
              "hal.buffer.allocation.discard", "hal.buffer.allocation.preserve",
              "util.buffer.dealloc"):
    CONTROL_OPS[_name] = _noop
