"""Handlers for the ``hal`` dialect: devices, executables, buffers, buffer
views, command buffers, the queue and fences, as IREE's HAL module runs them
for a local (CPU) device, on the :class:`~hal_cpu.iree.device.Device`.

Operands are read through the typed op views of ``iree.compiler.ir``
(``CommandBufferDispatchOp.workgroup_x``, ``.binding_buffers``...).
"""

from __future__ import annotations

import fnmatch

from .device import Buffer, BufferView, CommandBuffer, Executable, FunctionRef, Handle, HostBuffer
from .errors import EvaluationError
from .ops_control import ProgramStatusError
from .scalars import (
    ELEMENT_CODES,
    ELEMENT_NAMES,
    element_name,
    int_width,
    pack_scalar,
    scalar_size,
    unpack_scalar,
    wrap,
)

__all__ = ["HAL_OPS"]

_WHOLE = 0xFFFFFFFFFFFFFFFF


def _ir():
    from iree.compiler import ir
    return ir


def _s(op, value) -> int:
    return op.slot(value)


def _need(value, kind, what: str):
    if not isinstance(value, kind):
        raise EvaluationError(f"{what} is {value!r}, not a {kind.__name__}")
    return value


def _buffer_name(op) -> str:
    return op.result_names[0].lstrip("%") if op.result_names else "buffer"


# -- values ------------------------------------------------------------------

def _element_type(op):
    ir = _ir()
    name = element_name(str(ir.TypeAttr(op.attr("type")).value))
    code = ELEMENT_CODES.get(name)
    if code is None:
        return None
    (out,) = op.results

    def run(m, r):
        r[out] = code
    return run


def _int_attr_op(attr_name: str):
    """Ops whose value is an integer attribute (``hal.encoding_type``,
    ``hal.memory_type``, ``hal.buffer_usage``)."""
    def build(op):
        ir = _ir()
        a = op.attr(attr_name)
        try:
            value = wrap(int(ir.IntegerAttr(a).value), 32) if a is not None else 0
        except (ValueError, TypeError):
            value = 0
        (out,) = op.results

        def run(m, r):
            r[out] = value
        return run
    return build


def _handle(what: str):
    def build(op):
        outs = op.results

        def run(m, r):
            for o in outs:
                r[o] = Handle(what)
        return run
    return build


def _devices_count(op):
    (out,) = op.results

    def run(m, r):
        r[out] = 1
    return run


def _device_query(op):
    ir = _ir()
    category = ir.StringAttr(op.attr("category")).value
    key = ir.StringAttr(op.attr("key")).value
    ok_slot, value_slot = op.results
    ty = op.result_types[1]
    default = op.attr("default_value")
    w = int_width(ty)
    default_value = wrap(int(ir.IntegerAttr(default).value), w) \
        if default is not None and w is not None else 0

    def run(m, r):
        answer = None
        if category == "hal.device.id":
            answer = int(fnmatch.fnmatchcase("local-sync", key)
                         or fnmatch.fnmatchcase("local-task", key))
        elif category == "hal.executable.format":
            if m.variant is None:       # IR without a known target: any ELF
                answer = int(key.startswith("embedded-elf-"))
            else:
                fmt = "embedded-elf-" + m.variant[len("embedded_elf_"):]
                answer = int(fnmatch.fnmatchcase(fmt, key))
        elif key == "concurrency":
            answer = 1
        if answer is None:
            r[ok_slot], r[value_slot] = 0, default_value
        else:
            r[ok_slot], r[value_slot] = 1, wrap(answer, w or 64)
    return run


def _executable_create(op):
    ir = _ir()
    target = ir.SymbolRefAttr(op.attr("executable_target")).value
    (out,) = op.results
    exe = Executable(target[0], target[-1])

    def run(m, r):
        r[out] = exe
    return run


def _lookup_function(op):
    ir = _ir()
    parts = ir.SymbolRefAttr(op.attr("entry_point")).value
    if len(parts) != 3:
        return None
    fn = FunctionRef(*parts)
    (out,) = op.results

    def run(m, r):
        r[out] = fn
    return run


# -- buffers -----------------------------------------------------------------

def _alloca(op):
    v = op.view
    size = _s(op, v.result_size)
    (out,) = op.results
    name = _buffer_name(op)

    def run(m, r):
        r[out] = m.device.allocate(r[size], name)
    return run


def _allocator_import(op):
    v = op.view
    src, off, length = _s(op, v.source), _s(op, v.offset), _s(op, v.length)
    did, out = op.results
    name = _buffer_name(op)

    def run(m, r):
        host = _need(r[src], HostBuffer, "hal.allocator.import source")
        o, n = r[off], r[length]
        if o + n > host.data.size:
            raise EvaluationError(f"import of [{o}, {o + n}) from a {host.data.size}-byte "
                                  "util.buffer")
        r[did] = 1
        # a copy: kernels may write a constant's buffer in place (e.g. a sort
        # of an unfoldable constant), which must not change the module's data
        r[out] = m.device.constant(host.data[o:o + n].copy(), name)
    return run


def _file_from_memory(op):
    v = op.view
    src, off, length = _s(op, v.buffer), _s(op, v.offset), _s(op, v.length)
    (out,) = op.results

    def run(m, r):
        r[out] = Handle("file", (_need(r[src], HostBuffer, "file memory"), r[off], r[length]))
    return run


def _queue_read(op):
    v = op.view
    src, soff = _s(op, v.source_file), _s(op, v.source_offset)
    dst, doff, length = _s(op, v.target_buffer), _s(op, v.target_offset), _s(op, v.length)

    def run(m, r):
        f = r[src]
        if not (isinstance(f, Handle) and f.what == "file"):
            raise EvaluationError("hal.device.queue.read from something that is not a "
                                  "file made from memory (parameter files are not supported)")
        host, base, size = f.data
        o, n = base + r[soff], r[length]
        if r[soff] + n > size:
            raise EvaluationError(f"read of [{r[soff]}, {r[soff] + n}) from a {size}-byte file")
        m.device.write(_need(r[dst], Buffer, "read target"), r[doff],
                       host.data[o:o + n].tobytes(), "hal.device.queue.read")
    return run


def _subspan(op):
    v = op.view
    src, off, length = _s(op, v.source_buffer), _s(op, v.source_offset), _s(op, v.length)
    (out,) = op.results

    def run(m, r):
        b = _need(r[src], Buffer, "subspan source")
        o, n = r[off], r[length]
        if o + n > b.length:
            raise EvaluationError(f"subspan [{o}, {o + n}) of a {b.length}-byte buffer")
        r[out] = Buffer(b.storage, b.offset + o, n)
    return run


def _buffer_length(op):
    (src,), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = _need(r[src], Buffer, "buffer").length
    return run


def _buffer_load(op):
    v = op.view
    src, off = _s(op, v.source_buffer), _s(op, v.source_offset)
    (out,) = op.results
    ty = op.result_types[0]
    size = scalar_size(ty)

    def run(m, r):
        data = m.device.read(_need(r[src], Buffer, "hal.buffer.load source"), r[off], size,
                             f"hal.buffer.load of {op.result_names[0]}")
        r[out] = unpack_scalar(data, ty)
    return run


def _buffer_store(op):
    v = op.view
    val, dst, off = _s(op, v.value), _s(op, v.target_buffer), _s(op, v.target_offset)
    ty = str(v.value.type)

    def run(m, r):
        m.device.write(_need(r[dst], Buffer, "hal.buffer.store target"), r[off],
                       pack_scalar(r[val], ty), "hal.buffer.store")
    return run


# -- buffer views --------------------------------------------------------------

def _view_create(op):
    v = op.view
    src, off, length = _s(op, v.source_buffer), _s(op, v.source_offset), _s(op, v.source_length)
    et, enc = _s(op, v.element_type), _s(op, v.encoding_type)
    dims = [_s(op, d) for d in v.shape]
    (out,) = op.results

    def run(m, r):
        b = _need(r[src], Buffer, "buffer view storage")
        o, n = r[off], r[length]
        if o + n > b.length:
            raise EvaluationError(f"buffer view over [{o}, {o + n}) of a {b.length}-byte buffer")
        code = r[et]
        name = ELEMENT_NAMES.get(code)
        if name is None:
            raise EvaluationError(f"element type {code:#x} is not one the runtime knows")
        r[out] = BufferView(Buffer(b.storage, b.offset + o, n), tuple(r[d] for d in dims),
                            name, r[enc])
    return run


def _view_buffer(op):
    (src,), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = _need(r[src], BufferView, "buffer view").buffer
    return run


def _view_dim(op):
    ir = _ir()
    (src,), (out,) = op.operands, op.results
    index = ir.IntegerAttr(op.attr("index")).value

    def run(m, r):
        shape = _need(r[src], BufferView, "buffer view").shape
        if index >= len(shape):
            raise EvaluationError(f"dimension {index} of a rank-{len(shape)} buffer view")
        r[out] = wrap(shape[index], 64)
    return run


def _view_rank(op):
    (src,), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = len(_need(r[src], BufferView, "buffer view").shape)
    return run


def _view_element_type(op):
    (src,), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = ELEMENT_CODES[_need(r[src], BufferView, "buffer view").element_type]
    return run


def _view_encoding_type(op):
    (src,), (out,) = op.operands, op.results

    def run(m, r):
        r[out] = _need(r[src], BufferView, "buffer view").encoding
    return run


class InputMismatchError(EvaluationError, ValueError):
    """A function input whose shape or element type the program's own checks
    (``hal.buffer_view.assert``) reject."""


def _compatible(have: str, want: str) -> bool:
    """Equal element types, or integers of one width whose signedness only
    one side states (``i8`` and ``ui8``)."""
    if have == want:
        return True
    ints = {have.lstrip("su"), want.lstrip("su")}
    return len(ints) == 1 and ints.pop().startswith("i") and "i1" not in (have, want)


def _view_assert(op):
    ir = _ir()
    v = op.view
    src, et = _s(op, v.buffer_view), _s(op, v.element_type)
    dims = [_s(op, d) for d in v.shape]
    message = ir.StringAttr(op.attr("message")).value if op.attr("message") else "input"

    def run(m, r):
        view = _need(r[src], BufferView, message)
        want = [r[d] for d in dims]
        if list(view.shape) != want:
            raise InputMismatchError(f"{message}: expected shape {want}, got {list(view.shape)}")
        want_type = ELEMENT_NAMES.get(r[et], hex(r[et]))
        if not _compatible(view.element_type, want_type):
            raise InputMismatchError(f"{message}: expected element type {want_type}, "
                                     f"got {view.element_type}")
    return run


def _view_trace(op):
    def run(m, r):
        pass
    return run


# -- command buffers ---------------------------------------------------------

def _cb_create(op):
    (out,) = op.results

    def run(m, r):
        r[out] = CommandBuffer()
    return run


def _ref(op, value):
    """A binding reference operand: a slot number (``index``) or a buffer."""
    s = _s(op, value)
    is_slot = str(value.type) == "index"

    def get(r):
        return r[s] if is_slot else _need(r[s], Buffer, "binding buffer")
    return get


def _cb(r, slot) -> CommandBuffer:
    return _need(r[slot], CommandBuffer, "command buffer")


def _cb_dispatch(op):
    v = op.view
    cb = _s(op, v.command_buffer)
    fn = _s(op, v.entry_point)
    wg = [_s(op, v.workgroup_x), _s(op, v.workgroup_y), _s(op, v.workgroup_z)]
    consts = [_s(op, c) for c in v.constants]
    binds = [(_ref(op, b), _s(op, o), _s(op, n)) for b, o, n in
             zip(v.binding_buffers, v.binding_offsets, v.binding_lengths)]

    def run(m, r):
        f = _need(r[fn], FunctionRef, "dispatch function")
        _cb(r, cb).commands.append((
            "dispatch", f, tuple(r[x] for x in wg), [r[c] & 0xFFFFFFFF for c in consts],
            [(get(r), r[o], r[n]) for get, o, n in binds]))
    return run


def _cb_fill(op):
    v = op.view
    cb = _s(op, v.command_buffer)
    target, off, length = _ref(op, v.target_buffer), _s(op, v.target_offset), _s(op, v.length)
    pat = _s(op, v.pattern)
    ty = str(v.pattern.type)

    def run(m, r):
        _cb(r, cb).commands.append(("fill", target(r), r[off], r[length],
                                    pack_scalar(r[pat], ty)))
    return run


def _cb_copy(op):
    v = op.view
    cb = _s(op, v.command_buffer)
    src, soff = _ref(op, v.source_buffer), _s(op, v.source_offset)
    dst, doff, length = _ref(op, v.target_buffer), _s(op, v.target_offset), _s(op, v.length)

    def run(m, r):
        _cb(r, cb).commands.append(("copy", src(r), r[soff], dst(r), r[doff], r[length]))
    return run


def _queue_execute(op):
    cb = _s(op, op.view.command_buffer)

    def run(m, r):
        m.device.submit(_cb(r, cb), None)
    return run


def _queue_execute_indirect(op):
    v = op.view
    cb = _s(op, v.command_buffer)
    table = [(_s(op, b), _s(op, o), _s(op, n)) for b, o, n in
             zip(v.binding_buffers, v.binding_offsets, v.binding_lengths)]

    def run(m, r):
        m.device.submit(_cb(r, cb), [(_need(r[b], Buffer, "binding table buffer"), r[o], r[n])
                                     for b, o, n in table])
    return run


def _queue_fill(op):
    v = op.view
    dst, off, length = _s(op, v.target_buffer), _s(op, v.target_offset), _s(op, v.length)
    pat = _s(op, v.pattern)
    ty = str(v.pattern.type)

    def run(m, r):
        b = _need(r[dst], Buffer, "fill target")
        n = r[length]
        if n == _WHOLE:
            n = b.length - r[off]
        m.device.fill(b, r[off], n, pack_scalar(r[pat], ty))
    return run


def _queue_copy(op):
    v = op.view
    src, soff = _s(op, v.source_buffer), _s(op, v.source_offset)
    dst, doff, length = _s(op, v.target_buffer), _s(op, v.target_offset), _s(op, v.length)

    def run(m, r):
        m.device.copy(_need(r[src], Buffer, "copy source"), r[soff],
                      _need(r[dst], Buffer, "copy target"), r[doff], r[length])
    return run


def _queue_update(op):
    v = op.view
    src, soff = _s(op, v.source_buffer), _s(op, v.source_offset)
    dst, doff, length = _s(op, v.target_buffer), _s(op, v.target_offset), _s(op, v.length)

    def run(m, r):
        host = _need(r[src], HostBuffer, "update source")
        o, n = r[soff], r[length]
        m.device.write(_need(r[dst], Buffer, "update target"), r[doff],
                       host.data[o:o + n].tobytes(), "hal.device.queue.update")
    return run


# -- fences --------------------------------------------------------------------

def _fence_await(op):
    (out,) = op.results

    def run(m, r):
        r[out] = 0          # every submission has completed: execution is synchronous
    return run


def _fence_fail(op):
    status = _s(op, op.view.status)

    def run(m, r):
        raise ProgramStatusError(f"a fence was failed with status {r[status]}")
    return run


HAL_OPS = {
    "hal.element_type": _element_type,
    "hal.encoding_type": _int_attr_op("encoding"),
    "hal.memory_type": _int_attr_op("type"),
    "hal.buffer_usage": _int_attr_op("usage"),
    "hal.devices.count": _devices_count,
    "hal.devices.get": _handle("device"),
    "hal.device.query": _device_query,
    "hal.device.allocator": _handle("allocator"),
    "hal.command_buffer.device": _handle("device"),
    "hal.executable.create": _executable_create,
    "hal.executable.lookup.function": _lookup_function,
    "hal.device.queue.alloca": _alloca,
    "hal.allocator.allocate": _alloca,
    "hal.allocator.import": _allocator_import,
    "hal.ex.file.from_memory": _file_from_memory,
    "hal.device.queue.read": _queue_read,
    "hal.buffer.subspan": _subspan,
    "hal.buffer.length": _buffer_length,
    "hal.buffer.load": _buffer_load,
    "hal.buffer.store": _buffer_store,
    "hal.buffer_view.create": _view_create,
    "hal.buffer_view.buffer": _view_buffer,
    "hal.buffer_view.dim": _view_dim,
    "hal.buffer_view.rank": _view_rank,
    "hal.buffer_view.element_type": _view_element_type,
    "hal.buffer_view.encoding_type": _view_encoding_type,
    "hal.buffer_view.assert": _view_assert,
    "hal.buffer_view.trace": _view_trace,
    "hal.command_buffer.create": _cb_create,
    "hal.command_buffer.dispatch": _cb_dispatch,
    "hal.command_buffer.fill_buffer": _cb_fill,
    "hal.command_buffer.copy_buffer": _cb_copy,
    "hal.device.queue.execute": _queue_execute,
    "hal.device.queue.execute.indirect": _queue_execute_indirect,
    "hal.device.queue.fill": _queue_fill,
    "hal.device.queue.copy": _queue_copy,
    "hal.device.queue.update": _queue_update,
    "hal.fence.create": _handle("fence"),
    "hal.fence.join": _handle("fence"),
    "hal.fence.await": _fence_await,
    "hal.fence.query": _fence_await,
    "hal.fence.fail": _fence_fail,
}
