"""Debugger-style reports for faults in emulated dispatches.

When the emulated CPU stops on a fault during a dispatch, the backend's
:class:`elfloader.EmulationError` knows the pc, the kind of access and the
exact address it touched; this module adds what only the dispatch knows
(file, export, the worker that faulted and the workgroup it was running,
where each binding, the local memory and the stacks lie) and formats it
with :mod:`elfloader.diagnose`: symbol+offset, source line from DWARF, the
faulting instruction, and what the data address lies in.

An access that reached the guard page after a binding or local memory is
an :class:`~hal_cpu.errors.OverrunError`, as is a write into the canary
bytes before the guard page, which the backend finds when the dispatch
ends (:func:`binding_overrun`).

A fault inside a plugin's code is reported against the module that owns
the pc: a dispatch's report names the plugin file, its symbol (from
``.symtab`` and DWARF too) and the import the executable called
(:func:`dispatch_fault`); an import called directly, as the pytest
fixtures do, gets the same report with the guarded test arrays as the
regions a data address is described from (:func:`import_fault`). A call
stopped at its time limit becomes a :class:`~hal_cpu.errors.
CallTimeoutError` whose report shows where the CPU was.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

from elfloader import EmulationError, Fault, GuardError
from elfloader.diagnose import (
    INSTRUCTION_FAULTS,
    Region,
    Symbolizer,
    describe_address,
    engine_of,
    fault_report,
    joined_names,
    time_limit_kind,
)
from elfloader.errors import FaultReport
from fatelf.text import one_line

from . import abi
from .errors import (
    BindingOverrunError,
    BindingUnderrunError,
    CallTimeoutError,
    LocalMemoryOverrunError,
)


def timed_out(exc: EmulationError) -> bool:
    """Whether ``exc`` is a call stopped at the backend's time limit
    (``fault.kind`` ``"timeout"``; the CPU stopped somewhere that is not a
    fault)."""
    return exc.fault is not None and exc.fault.kind == "timeout"


def _without_pc(exc: EmulationError, file: str, arch: str,
                where: str) -> EmulationError:
    """``exc`` when its fault has no pc (stopped by request, an agent that
    died) or it has no fault; a system call whose pc died with the qemu
    engine's agent (a process creation) gets a one-line report naming the
    file and the function instead, with the same fault."""
    fault = exc.fault
    if fault is None or fault.kind != "syscall":
        return exc
    message = (f"{one_line(file, 300)}: {arch}: {one_line(where, 300)}: "
               f"{fault.what} (the sandbox ended "
               "the guest agent; its pc is not known)")
    return EmulationError(message, name=file, field="call", fault=fault,
                          whole_message=True)


def _thumb(arch, pc: int) -> bool:
    """Whether ``pc`` is Thumb code (bit 0 set on an architecture whose
    code addresses carry the instruction set there)."""
    return arch.disassembly.thumb_modes is not None and bool(pc & 1)


def _symbolizers(modules, entry_points=None) -> list[Symbolizer]:
    return [Symbolizer(m.image, m.base, entry_points if i == 0 else None)
            for i, m in enumerate(modules)]


def dispatch_fault(exc: EmulationError, exe, export, pointers: Sequence[int],
                   lengths: Sequence[int], layout) -> EmulationError:
    """An :class:`EmulationError` whose message is the full fault report of
    ``exc`` raised while dispatching ``export`` of ``exe``; it keeps
    ``exc``'s ``fault`` (for a time limit, with the pc without arm32's
    Thumb bit) and ``worker`` and adds ``report``.

    The workgroup and local memory are those of the worker that faulted
    (``exc.worker``, default 0). When the data address lies in the guard
    page after a binding or the local memory, the error is a
    :class:`BindingOverrunError` or :class:`LocalMemoryOverrunError`
    (``field`` ``bindings[N]`` or ``local_memory``, ``value`` the offset
    past the start)."""
    fault = exc.fault
    pc = fault.pc if fault is not None else None
    if fault is None or pc is None:
        return _without_pc(exc, exe.path, exe.arch.name,
                           f"export {export.label}")
    be = exe.backend
    worker = exc.worker or 0
    if not 0 <= worker < len(layout.workgroup_states):
        worker = 0
    workgroup = None
    regions = [Region(f"binding {i}", p, n) for i, (p, n)
               in enumerate(zip(pointers, lengths))]
    local = None
    try:
        wg = abi.WORKGROUP_STATE.layout(*be.arch.c_abi)
        ids = wg.unpack(be.read(layout.workgroup_states[worker], wg.size))
        workgroup = (ids["workgroup_id_x"], ids["workgroup_id_y"],
                     ids["workgroup_id_z"])
        if export.local_memory_size:
            local = Region("local memory", ids["local_memory"],
                           export.local_memory_size)
            regions.append(local)
    except Exception:  # noqa: BLE001 - the report goes on without them
        pass
    # Bindings and local memory may be overrun; an address by the stack
    # (only its guard page below can fault) is described from it too.
    overrunnable = regions[:]
    for w, (start, size) in enumerate(be.stacks()):
        if w < layout.workers:
            name = "the stack" if w == worker else f"the stack of worker {w}"
            regions.append(Region(name, start, size))
    address = fault.data_address
    guarded = None
    if address is not None:
        hit = be.guard_page(address)
        if hit is not None:
            guard, start = hit
            regions.append(Region("guard page", guard, be.page_size,
                                  offsets=False, guard=True))
            guarded = next((r for r in overrunnable if r.start == start), None)
    modules = [exe.module] + [p.module for p in getattr(
        getattr(exe, "plugins", None), "plugins", ()) if hasattr(p, "module")]
    symbolizers = _symbolizers(modules, {e.label: e.address
                                         for e in exe.exports})
    stopped = timed_out(exc)
    seconds = be.timeout_us / 1e6
    kind = (time_limit_kind(seconds) if stopped
            else fault.what or exc.message)
    thumb = _thumb(exe.arch, pc)
    pc = pc & ~1 if thumb else pc
    file, function, kind_of, caller = exe.path, export.label, "export", None
    holder = next((i for i, s in enumerate(symbolizers) if s.contains(pc)), 0)
    if holder:
        # Plugin code: report it against the plugin, as the import called.
        symbolizers.insert(0, symbolizers.pop(holder))
        file = modules[holder].name
        function, kind_of = _import_called(exe, symbolizers[0], pc), "import"
        caller = f"export {export.label} of {os.path.basename(exe.path)}"
    report = fault_report(
        file=file, arch=exe.arch.name, kind=kind, pc=pc,
        symbolizers=symbolizers, read=be.read, function=function,
        function_kind=kind_of, workgroup=workgroup, data_address=address,
        regions=regions, thumb=thumb, caller=caller,
        instruction_fault=fault.kind in INSTRUCTION_FAULTS,
        engine=engine_of(be))
    # The report is the whole message: no "name: field:" before it.
    message = report.format(be.pointer_size)
    if stopped:
        return CallTimeoutError(
            message, seconds=seconds, function=export.label, name=exe.path,
            field="timeout", value=seconds,
            fault=dataclasses.replace(fault, pc=pc), report=report,
            worker=worker, whole_message=True)
    if guarded is None or address is None:
        return EmulationError(message, name=exe.path, field="dispatch",
                              value=pc, fault=fault, report=report,
                              worker=worker, whole_message=True)
    offset = address - guarded.start
    facts = dict(name=exe.path, value=offset, export=export.label,
                 what=guarded.name, offset=offset, length=guarded.size,
                 workgroup=workgroup, fault=fault, report=report,
                 whole_message=True)
    if guarded is local:
        return LocalMemoryOverrunError(message, field="local_memory",
                                       worker=worker, **facts)
    index = regions.index(guarded)
    cls = (BindingUnderrunError if address < guarded.start
           else BindingOverrunError)
    return cls(message, field=f"bindings[{index}]", binding=index,
               worker=worker, **facts)


def binding_overrun(exc: GuardError, exe, export, pointers: Sequence[int],
                    lengths: Sequence[int]
                    ) -> BindingOverrunError | BindingUnderrunError:
    """The :class:`BindingOverrunError` for canary bytes after a binding
    that a dispatch of ``export`` changed (``exc`` from the binding's
    ``finish``), or :class:`BindingUnderrunError` for those before its
    start (negative offsets): ``field`` ``bindings[N]``, ``value`` the
    offset from the binding's start of the first changed byte."""
    same = [i for i, p in enumerate(pointers) if p == exc.address]
    index = same[0] if same else None
    what = (joined_names([f"binding {i}" for i in same]) if same
            else "a binding")
    length = lengths[index] if index is not None else exc.size
    where = describe_address(exc.address + exc.offset,
                             [Region(what, exc.address, length)])
    changed = (f"byte {exc.offset} changed" if exc.last_offset == exc.offset
               else f"bytes {exc.offset} to {exc.last_offset} changed")
    cls: type[BindingOverrunError] | type[BindingUnderrunError] = (
        BindingUnderrunError if exc.offset < 0 else BindingOverrunError)
    side = "before the start" if exc.offset < 0 else "past the end"
    err = cls(
        f"export {export.label} wrote {side} of {what}: {where}; "
        f"{changed} (seen after the dispatch)", name=exe.path,
        field=f"bindings[{index}]" if index is not None else "bindings",
        value=exc.offset, binding=index, export=export.label, what=what,
        offset=exc.offset, length=length, fault=exc.fault)
    return err


def _import_called(exe, symbolizer: Symbolizer, pc: int) -> str:
    """The name of the executable's import whose function holds ``pc``
    (the function symbol's start is the resolved import's address), else
    the symbol's name."""
    hit = symbolizer.lookup(pc)
    if hit is None:
        return "(unknown import)"
    start = pc - hit[1]
    for name, fn in getattr(exe, "import_functions", {}).items():
        if fn & ~1 == start:
            return name
    return hit[0]


def import_fault(exc: EmulationError, backend, modules, import_name: str,
                 arrays, names: dict | None = None,
                 seconds: float | None = None,
                 function_kind: str = "import",
                 overrun: Callable[[Fault, FaultReport], str | None]
                 | None = None) -> EmulationError:
    """The error for ``exc``, raised by a direct call of import
    ``import_name`` (as the pytest fixtures make): its message is the fault
    report against the module that owns the pc (``modules``: the loaded
    plugins, :class:`elfloader.ElfModule`), with data addresses described
    from the guarded test arrays ``arrays`` (:class:`hal_cpu.testing.guarded.
    GuardedArrays`; ``names`` maps an array to the name to use;
    ``seconds`` is the call's time limit, default the backend's;
    ``arrays`` None: the call takes none; ``function_kind``: what the
    report calls ``import_name``; ``overrun(fault, report)``: the
    report's ``overrun`` row for a fault with a data address, or None).

    Returns:
        :class:`BindingOverrunError` / :class:`BindingUnderrunError` when
        the data address lies in a guard page or gap of an array (``what``
        its name, ``offset`` from its start, ``import_name``);
        :class:`CallTimeoutError` for a call stopped at the backend's time
        limit; else an :class:`EmulationError` with the report as message.
        Each has ``report`` (the :class:`elfloader.diagnose.FaultReport`)
        and ``exc``'s ``fault`` with the pc without arm32's Thumb bit.
        ``exc`` itself when it has a report already (a plugin function's
        fault reported by :func:`call_fault`, e.g. while the fixtures load
        the plugin) or its fault has no pc (e.g. stopped by request).
    """
    if exc.report is not None:
        return exc
    fault = exc.fault
    pc = fault.pc if fault is not None else None
    if fault is None or pc is None:
        file = modules[0].name if modules else "(plugin)"
        return _without_pc(exc, file, backend.arch.name,
                           f"import {import_name}")
    arch = backend.arch
    stopped = timed_out(exc)
    if seconds is None:
        seconds = backend.timeout_us / 1e6
    thumb = _thumb(arch, pc)
    pc = pc & ~1 if thumb else pc
    symbolizers = _symbolizers(modules)
    holder = next((s for s in symbolizers if s.contains(pc)), None)
    if holder is not None:
        symbolizers.remove(holder)
        symbolizers.insert(0, holder)
    file = (holder.image.name if holder is not None
            else modules[0].name if modules else "(plugin)")
    regions = arrays.regions(names) if arrays is not None else []
    for w, (start, size) in enumerate(backend.stacks()):
        if w == 0:
            regions.append(Region("the stack", start, size, offsets=False))
    address = None if stopped else fault.data_address
    kind = (time_limit_kind(seconds) if stopped
            else fault.what or exc.message)
    report = fault_report(
        file=file, arch=arch.name, kind=kind, pc=pc, symbolizers=symbolizers,
        read=backend.read, function=import_name, function_kind=function_kind,
        data_address=address, regions=regions, thumb=thumb,
        instruction_fault=fault.kind in INSTRUCTION_FAULTS,
        engine=engine_of(backend))
    if overrun is not None and address is not None:
        report.overrun = overrun(fault, report)
    # The report is the whole message: no "name: field:" before it.
    message = report.format(backend.pointer_size)
    near = (arrays.near(address) if address is not None and arrays is not None
            else None)
    fault = dataclasses.replace(fault, pc=pc)
    if stopped:
        return CallTimeoutError(message, seconds=seconds,
                                function=import_name, name=file,
                                field="timeout", value=seconds, fault=fault,
                                report=report, whole_message=True)
    if near is not None:
        return bounds_error(message, near[0], near[1], import_name, file,
                            names, fault=fault, report=report)
    return EmulationError(message, name=file, field=import_name, value=pc,
                          fault=fault, report=report, whole_message=True)


def call_fault(exc: EmulationError, backend, modules, function: str,
               function_kind: str) -> EmulationError:
    """The error for ``exc``, raised by a call into a loaded module that is
    not a dispatch (a plugin's query, load, resolve or unload; an
    executable library's query): its message is the fault report against
    the module in ``modules`` that owns the pc, naming ``function`` as a
    ``function_kind`` (e.g. ``plugin load``). Keeps ``exc``'s ``fault``
    and adds ``report``; ``exc`` itself when its fault has no pc. Call it
    before the modules' memory is released."""
    return import_fault(exc, backend, modules, function, None,
                        function_kind=function_kind)


def field_names(values, kind=None) -> dict:
    """Array -> the name a report gives it, from a params struct's
    ``values`` (field name -> value): the field it was passed as, or all of
    them for one array passed as several fields (``src and dst``).
    ``kind`` (a type, or a predicate) picks the values that are arrays;
    arrays named explicitly (an ``explicit_name`` attribute set) are left
    out, as the fixtures name those themselves."""
    def test(v) -> bool:
        if kind is None:
            return hasattr(v, "nbytes") and hasattr(v, "address")
        if isinstance(kind, type):
            return isinstance(v, kind)
        return kind(v)

    fields: dict = {}
    for key, value in values.items():
        if test(value) and not getattr(value, "explicit_name", False):
            fields.setdefault(value, []).append(str(key))
    return {array: joined_names(keys) for array, keys in fields.items()}


def bounds_error(message: str, array, offset: int, import_name: str,
                 file: str, names: dict | None = None,
                 **kw) -> BindingOverrunError | BindingUnderrunError:
    """:class:`BindingOverrunError` (``offset`` at or past the array's end)
    or :class:`BindingUnderrunError` (negative ``offset``) for an access of
    import ``import_name`` outside guarded test array ``array``; ``field``
    is ``arrays[NAME]``, ``value`` the offset; ``message`` is the whole
    message (a report). ``kw``: the :class:`EmulationError` arguments
    (``fault``, ``report``)."""
    name = (names or {}).get(array, array.name)
    cls = BindingUnderrunError if offset < 0 else BindingOverrunError
    return cls(message, name=file, field=f"arrays[{name}]", value=offset,
               binding=array.index, what=name, offset=offset,
               length=array.nbytes, import_name=import_name,
               whole_message=True, **kw)


