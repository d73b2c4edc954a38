"""Debugger-style reports for faults in emulated dispatches.

When the emulated CPU stops on a fault during a dispatch, the backend's
:class:`elfloader.EmulationError` knows the pc, the kind of access and the
page it touched; this module adds what only the dispatch knows (file,
export, the workgroup that was running, where each binding and the local
memory lie) and formats it with :mod:`elfloader.diagnose`: symbol+offset,
source line from DWARF, the faulting instruction, and what the data address
lies in.
"""

from __future__ import annotations

from typing import Sequence

from elfloader import EmulationError
from elfloader.diagnose import Region, Symbolizer, fault_report

from . import abi


def dispatch_fault(exc: EmulationError, exe, export, pointers: Sequence[int],
                   lengths: Sequence[int], layout) -> EmulationError:
    """An :class:`EmulationError` whose message is the full fault report of
    ``exc`` raised while dispatching ``export`` of ``exe``; it keeps
    ``fault``, ``pc`` and ``fault_page`` and adds ``report``."""
    pc = getattr(exc, "pc", None)
    if pc is None:
        return exc
    be = exe.backend
    workgroup = None
    regions = [Region(f"binding {i}", p, n) for i, (p, n)
               in enumerate(zip(pointers, lengths))]
    try:
        wg = abi.WORKGROUP_STATE.layout(*be.arch.c_abi)
        ids = wg.unpack(be.read(layout.workgroup_states[0], wg.size))
        workgroup = (ids["workgroup_id_x"], ids["workgroup_id_y"],
                     ids["workgroup_id_z"])
        if export.local_memory_size:
            regions.append(Region("local memory", ids["local_memory"],
                                  export.local_memory_size))
    except Exception:  # noqa: BLE001 - the report goes on without them
        pass
    symbolizers = [Symbolizer(exe.module.image, exe.module.base,
                              {e.label: e.address for e in exe.exports})]
    kind = getattr(exc, "what", None) or exc.message
    report = fault_report(
        file=exe.path, arch=exe.arch.name, kind=kind, pc=pc & ~1,
        symbolizers=symbolizers, read=be.read, function=export.label,
        workgroup=workgroup, data_address=_data_address(exc),
        regions=regions, thumb=exe.arch.name == "arm32" and bool(pc & 1))
    err = EmulationError(report.format(be.pointer_size), name=None,
                         field=None, value=pc)
    err.name, err.field = exe.path, "dispatch"
    for attr in ("fault", "fault_page", "fault_address", "access_size", "pc"):
        setattr(err, attr, getattr(exc, attr, None))
    err.report = report
    return err


def _data_address(exc: EmulationError) -> int | None:
    """The exact address of a refused access, else its page."""
    exact = getattr(exc, "fault_address", None)
    return exact if exact is not None else getattr(exc, "fault_page", None)
