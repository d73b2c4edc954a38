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
"""

from __future__ import annotations

from typing import Sequence

from elfloader import EmulationError, GuardError
from elfloader.diagnose import (Region, Symbolizer, describe_address,
                                fault_report)

from . import abi
from .errors import BindingOverrunError, LocalMemoryOverrunError


def dispatch_fault(exc: EmulationError, exe, export, pointers: Sequence[int],
                   lengths: Sequence[int], layout) -> EmulationError:
    """An :class:`EmulationError` whose message is the full fault report of
    ``exc`` raised while dispatching ``export`` of ``exe``; it keeps
    ``fault``, ``pc``, ``fault_page``, ``fault_address``, ``access_size``
    and ``worker`` and adds ``report``.

    The workgroup and local memory are those of the worker that faulted
    (``exc.worker``, default 0). When the data address lies in the guard
    page after a binding or the local memory, the error is a
    :class:`BindingOverrunError` or :class:`LocalMemoryOverrunError`
    (``field`` ``bindings[N]`` or ``local_memory``, ``value`` the offset
    past the start)."""
    pc = getattr(exc, "pc", None)
    if pc is None:
        return exc
    be = exe.backend
    worker = getattr(exc, "worker", 0) or 0
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
    stacks = getattr(be, "stacks", None)
    for w, (start, size) in enumerate(stacks() if stacks else ()):
        if w < layout.workers:
            name = "the stack" if w == worker else f"the stack of worker {w}"
            regions.append(Region(name, start, size))
    address = _data_address(exc)
    guarded = None
    if address is not None:
        hit = be.guard_page(address)
        if hit is not None:
            guard, start = hit
            regions.append(Region("guard page", guard, be.page_size,
                                  offsets=False, guard=True))
            guarded = next((r for r in overrunnable if r.start == start), None)
    symbolizers = [Symbolizer(exe.module.image, exe.module.base,
                              {e.label: e.address for e in exe.exports})]
    kind = getattr(exc, "what", None) or exc.message
    # Bit 0 of an arm32 pc marks Thumb code; elsewhere it is the address.
    thumb = exe.arch.name == "arm32" and bool(pc & 1)
    report = fault_report(
        file=exe.path, arch=exe.arch.name, kind=kind,
        pc=pc & ~1 if thumb else pc, symbolizers=symbolizers, read=be.read,
        function=export.label, workgroup=workgroup, data_address=address,
        regions=regions, thumb=thumb)
    message = report.format(be.pointer_size)
    if guarded is None:
        err = EmulationError(message, name=None, field=None, value=pc)
        err.name, err.field = exe.path, "dispatch"
    else:
        facts = dict(name=exe.path, value=address - guarded.start,
                     export=export.label, what=guarded.name,
                     offset=address - guarded.start, length=guarded.size,
                     workgroup=workgroup)
        if guarded is local:
            err = LocalMemoryOverrunError(message, field="local_memory",
                                          worker=worker, **facts)
        else:
            index = regions.index(guarded)
            err = BindingOverrunError(message, field=f"bindings[{index}]",
                                      binding=index, **facts)
        # The report is the whole message: no "name: field:" before it.
        Exception.__init__(err, message)
    for attr in ("fault", "fault_page", "fault_address", "access_size", "pc"):
        setattr(err, attr, getattr(exc, attr, None))
    err.worker = worker
    err.report = report
    return err


def binding_overrun(exc: GuardError, exe, export, pointers: Sequence[int],
                    lengths: Sequence[int]) -> BindingOverrunError:
    """The :class:`BindingOverrunError` for canary bytes after a binding
    that a dispatch of ``export`` changed (``exc`` from the binding's
    ``finish``): ``field`` ``bindings[N]``, ``value`` the offset from the
    binding's start of the first changed byte."""
    index = next((i for i, p in enumerate(pointers) if p == exc.address), None)
    what = f"binding {index}" if index is not None else "a binding"
    length = lengths[index] if index is not None else exc.size
    where = describe_address(exc.fault_address,
                             [Region(what, exc.address, length)])
    changed = (f"byte {exc.offset} changed" if exc.last_offset == exc.offset
               else f"bytes {exc.offset} to {exc.last_offset} changed")
    err = BindingOverrunError(
        f"export {export.label} wrote past the end of {what}: {where}; "
        f"{changed} (seen after the dispatch)", name=exe.path,
        field=f"bindings[{index}]" if index is not None else "bindings",
        value=exc.offset, binding=index, export=export.label, what=what,
        offset=exc.offset, length=length)
    err.fault, err.fault_address = "overrun", exc.fault_address
    return err


def _data_address(exc: EmulationError) -> int | None:
    """The exact address of a refused access, else its page."""
    exact = getattr(exc, "fault_address", None)
    return exact if exact is not None else getattr(exc, "fault_page", None)
