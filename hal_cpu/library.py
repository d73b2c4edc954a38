"""Executable libraries: query, exports, imports and workgroup dispatch.

An executable library is the ELF that ``iree-compile`` embeds for the
llvm-cpu backend. Its exported ``iree_hal_executable_library_query`` returns
the library struct (iree/hal/local/executable_library.h, v0.6): a header
(name, features, sanitizer), an import table, an export table (dispatch
function pointers with their attrs, names and tags) and the executable
constant count. :class:`Executable` loads it with :mod:`elfloader` and runs
each workgroup of a 3-D grid with the environment, dispatch state and
workgroup state laid out for the image's pointer width.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import elfloader
from elfloader import Backend, as_int32

from . import abi
from .errors import (DispatchError, ExportNotFoundError, LibraryError,
                     UnresolvedImportError)
from .memory import GuestView, ptr_array
from fatelf.cstruct import pack_array


@dataclass(frozen=True)
class Export:
    """One dispatch function of an executable library.

    Attributes:
        ordinal: index in the export table (IREE's ``--entry_point``).
        name: export name (``None`` when the library strips names).
        tag: optional tag string.
        address: function pointer in the backend's address space.
        workgroup_size: (x, y, z) threads per workgroup, from the attrs.
        constant_count, binding_count: how many the export reads; a dispatch
            must pass at least these many.
        local_memory_pages: 4 KiB pages of workgroup-local memory it needs.
        flags: ``iree_hal_executable_dispatch_flags_v0_t`` bits.
        parameter_count: number of described parameters.
    """

    ordinal: int
    name: str | None
    tag: str | None
    address: int
    workgroup_size: tuple[int, int, int]
    constant_count: int
    binding_count: int
    local_memory_pages: int
    flags: int
    parameter_count: int

    @property
    def local_memory_size(self) -> int:
        """Bytes of workgroup-local memory (pages x 4096)."""
        return self.local_memory_pages * abi.WORKGROUP_LOCAL_MEMORY_PAGE_SIZE

    @property
    def label(self) -> str:
        return self.name if self.name is not None else f"#{self.ordinal}"


def _as_binding(value, index: int) -> np.ndarray:
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise DispatchError("binding arrays must be C-contiguous",
                                field=f"bindings[{index}]", value=value.shape)
        return value
    try:
        return np.frombuffer(value, dtype=np.uint8)
    except (TypeError, ValueError):
        raise DispatchError(f"{type(value).__name__} is neither a numpy array "
                            "nor a buffer", field=f"bindings[{index}]",
                            value=type(value).__name__) from None


class Executable:
    """A loaded executable library.

    Args:
        source: path or bytes of an ELF or FatELF.
        backend: ``"auto"`` (native for the host architecture, else
            emulated), ``"native"``, ``"emulated"``, or a
            :class:`elfloader.Backend` to load into.
        arch: architecture expected / to select from a FatELF.
        plugins: a :class:`hal_cpu.PluginManager` resolving the imports; its
            backend is used (executable and plugins share one machine).
        timeout: per-call limit in seconds for the emulated backend (0: none).

    Attributes:
        name, version, features, sanitizer: from the library header.
        exports: list of :class:`Export`; imports: import names (``?`` marks
        optional ones); constant_count: executable-level constants.

    Raises:
        elfloader.ElfError: the ELF cannot be loaded.
        LibraryError: the query returns NULL (the message names the version
            asked for) or the library tables are malformed.
        UnresolvedImportError: required imports nobody provides.
    """

    def __init__(self, source, *, backend="auto", arch=None, plugins=None,
                 timeout: float = 0.0):
        if plugins is not None:
            backend = plugins.backend
        options = {"timeout": timeout} if timeout else {}
        self.module = elfloader.load(source, arch=arch, backend=backend, **options)
        self._owns_backend = not isinstance(backend, Backend)
        self.backend: Backend = self.module.backend
        self.arch = self.module.arch
        self.path = self.module.name
        self._allocs: list[int] = []
        try:
            self._query(plugins)
        except BaseException:
            self.close()
            raise

    # --- loading ----------------------------------------------------------
    def _alloc(self, data: bytes) -> int:
        addr = self.backend.alloc_bytes(data)
        self._allocs.append(addr)
        return addr

    def _query(self, plugins) -> None:
        be = self.backend
        mod = self.module
        view = self.view = GuestView(be, mod, self.path)
        query = mod.lookup(abi.LIBRARY_QUERY)
        view.check_code(query, abi.LIBRARY_QUERY)
        env_layout = abi.ENVIRONMENT.layout(*be.arch.c_abi)
        self._env = self._alloc(bytes(env_layout.size))
        result = be.call(query, abi.LIBRARY_VERSION, self._env)
        if result == 0:
            raise LibraryError(
                f"{abi.LIBRARY_QUERY} returned NULL for version "
                f"{abi.LIBRARY_VERSION:#010x}: the library does not support "
                "the executable library ABI v0.6", name=self.path,
                field="max_version", value=abi.LIBRARY_VERSION)
        lib = view.struct(abi.LIBRARY_V0, result, "library")
        header = view.struct(abi.LIBRARY_HEADER, lib["header"], "library.header")
        self.version = header["version"]
        if self.version != abi.LIBRARY_VERSION:
            raise LibraryError(f"library version {self.version:#x} is not the "
                               f"supported {abi.LIBRARY_VERSION:#x}",
                               name=self.path, field="header.version",
                               value=self.version)
        self.name = view.string(header["name"], "header.name")
        self.features = header["features"]
        self.sanitizer = abi.SANITIZERS.get(header["sanitizer"],
                                            str(header["sanitizer"]))
        self.constant_count = lib["constants.count"]
        n = lib["imports.count"]
        if n > 4096:
            raise LibraryError(f"{n} imports", name=self.path,
                               field="imports.count", value=n)
        self.imports = [view.string(p, f"imports.symbols[{i}]", False) for i, p in
                        enumerate(view.array("ptr", lib["imports.symbols"], n,
                                             "imports.symbols"))]
        self.exports = self._read_exports(lib)
        self._bind_environment(plugins)

    def _read_exports(self, lib) -> list[Export]:
        view = self.view
        n = lib["exports.count"]
        if n > 65536:
            raise LibraryError(f"{n} exports", name=self.path,
                               field="exports.count", value=n)
        ptrs = view.array("ptr", lib["exports.ptrs"], n, "exports.ptrs")
        attrs = (view.structs(abi.DISPATCH_ATTRS, lib["exports.attrs"], n,
                              "exports.attrs") if lib["exports.attrs"] else [{}] * n)
        names = (view.array("ptr", lib["exports.names"], n, "exports.names")
                 if lib["exports.names"] else [0] * n)
        tags = (view.array("ptr", lib["exports.tags"], n, "exports.tags")
                if lib["exports.tags"] else [0] * n)
        exports = []
        for i in range(n):
            a = attrs[i]
            view.check_code(ptrs[i], f"exports.ptrs[{i}]")
            exports.append(Export(
                ordinal=i,
                name=view.string(names[i], f"exports.names[{i}]"),
                tag=view.string(tags[i], f"exports.tags[{i}]"),
                address=ptrs[i],
                workgroup_size=(a.get("workgroup_size_x") or 1,
                                a.get("workgroup_size_y") or 1,
                                a.get("workgroup_size_z") or 1),
                constant_count=a.get("constant_count", 0),
                binding_count=a.get("binding_count", 0),
                local_memory_pages=a.get("local_memory_pages", 0),
                flags=a.get("flags", 0),
                parameter_count=a.get("parameter_count", 0)))
        return exports

    def _bind_environment(self, plugins) -> None:
        be, ps = self.backend, self.backend.pointer_size
        names = self.imports
        if plugins is not None:
            funcs, contexts = plugins.resolve(names)
        else:
            missing = [s for s in names if not s.startswith("?")]
            if missing:
                raise UnresolvedImportError(
                    f"unresolved imports {', '.join(missing)}; no plugins were "
                    "given (pass plugins= or --executable_plugin)",
                    name=self.path, field="imports", value=missing,
                    missing=missing, searched=[])
            funcs = contexts = [0] * len(names)
        thunk = be.place_code(self.arch.import_thunk) if names else 0
        if thunk:
            self._allocs.append(thunk)
        constants = self._alloc(bytes(4 * max(self.constant_count, 1)))
        env = abi.ENVIRONMENT.layout(*be.arch.c_abi).pack(
            constants=constants, import_thunk=thunk,
            import_funcs=self._alloc(ptr_array(ps, funcs)) if names else 0,
            import_contexts=self._alloc(ptr_array(ps, contexts)) if names else 0)
        be.write(self._env, env)

    # --- dispatch ---------------------------------------------------------
    def export(self, key: int | str) -> Export:
        """The export with ordinal ``key`` (int) or name ``key`` (str).

        Raises:
            ExportNotFoundError: no such export; lists the available names.
        """
        if isinstance(key, (int, np.integer)):
            if 0 <= key < len(self.exports):
                return self.exports[key]
        else:
            for e in self.exports:
                if e.name == key:
                    return e
        raise ExportNotFoundError(
            f"no export {key!r}; exports: "
            f"{', '.join(e.label for e in self.exports) or '(none)'}",
            name=self.path, field="export", value=key)

    def dispatch(self, export: int | str,
                 workgroup_count: Sequence[int] = (1, 1, 1),
                 bindings: Sequence = (), constants: Sequence[int] = (),
                 *, workgroup_size: Sequence[int] | None = None,
                 processor_id: int = 0) -> None:
        """Run every workgroup of the grid.

        Args:
            export: ordinal or name.
            workgroup_count: (x, y, z), x, y < 2**32, z < 2**16; a zero
                count runs no workgroup.
            bindings: C-contiguous numpy arrays or writable buffers, in
                binding order; results land in them (zero copy natively).
            constants: uint32 push constants (ints in [0, 2**32)).
            workgroup_size: override of the export's (x, y, z).
            processor_id: value given to ``workgroup_state.processor_id``.

        Raises:
            DispatchError: fewer bindings/constants than the export declares,
                bad counts, or a workgroup returned non-zero (the message names
                the export and the workgroup id).
            elfloader.EmulationError: the emulated CPU faulted.
        """
        exp = self.export(export)
        where = dict(name=self.path)
        wc = tuple(int(v) for v in workgroup_count)
        if len(wc) != 3 or min(wc) < 0 or wc[0] >= 1 << 32 or \
                wc[1] >= 1 << 32 or wc[2] >= 1 << 16:
            raise DispatchError(f"workgroup count {wc} must be three "
                                "non-negative integers (z < 65536)",
                                field="workgroup_count", value=wc, **where)
        if len(bindings) < exp.binding_count:
            raise DispatchError(f"export {exp.label} declares {exp.binding_count} "
                                f"bindings, {len(bindings)} given",
                                field="bindings", value=len(bindings), **where)
        if len(constants) < exp.constant_count:
            raise DispatchError(f"export {exp.label} declares "
                                f"{exp.constant_count} constants, "
                                f"{len(constants)} given", field="constants",
                                value=len(constants), **where)
        if len(bindings) > abi.MAX_BINDING_COUNT or \
                len(constants) > abi.MAX_CONSTANT_COUNT:
            raise DispatchError("at most 64 bindings and 64 constants",
                                field="bindings", value=len(bindings), **where)
        try:
            consts = [int(c) for c in constants]
        except (TypeError, ValueError):
            raise DispatchError("constants must be integers (uint32 bit "
                                "patterns)", field="constants", **where) from None
        if any(not 0 <= c < 1 << 32 for c in consts):
            raise DispatchError("constants must fit uint32", field="constants",
                                value=consts, **where)
        arrays = [_as_binding(b, i) for i, b in enumerate(bindings)]
        if 0 in wc:
            return  # an empty grid runs nothing, as in IREE
        wsize = tuple(workgroup_size) if workgroup_size else exp.workgroup_size
        self._run(exp, wc, wsize, arrays, consts, processor_id)

    def _run(self, exp: Export, wc, wsize, arrays, consts, processor_id) -> None:
        be, ps = self.backend, self.backend.pointer_size
        abi_key = be.arch.c_abi
        finishers, scratch = [], None
        try:
            ptrs = []
            for a in arrays:
                addr, finish = be.map_array(a)
                ptrs.append(addr)
                finishers.append(finish)
            # One scratch block per dispatch: workgroup state, dispatch state,
            # constants, binding pointers and lengths, local memory.
            wg_layout = abi.WORKGROUP_STATE.layout(*abi_key)
            state_layout = abi.DISPATCH_STATE.layout(*abi_key)
            parts = [wg_layout.size, state_layout.size, 4 * len(consts),
                     ps * len(arrays), ps * len(arrays), exp.local_memory_size]
            offsets, total = [], 0
            for size in parts:
                offsets.append(total)
                total += -(-size // 64) * 64
            scratch = be.alloc(max(total, 64), 64)
            wg_addr, state_addr, c_addr, p_addr, l_addr, local = \
                [scratch + o for o in offsets]
            block = bytearray(total)
            state = state_layout.pack(
                workgroup_size_x=wsize[0], workgroup_size_y=wsize[1],
                workgroup_size_z=wsize[2], constant_count=len(consts),
                workgroup_count_x=wc[0], workgroup_count_y=wc[1],
                workgroup_count_z=wc[2], max_concurrency=1,
                binding_count=len(arrays), constants=c_addr,
                binding_ptrs=p_addr, binding_lengths=l_addr)
            for off, data in ((offsets[1], state),
                              (offsets[2], pack_array("u32", ps, consts)),
                              (offsets[3], ptr_array(ps, ptrs)),
                              (offsets[4], ptr_array(ps, [a.nbytes for a in arrays]))):
                block[off:off + len(data)] = data
            wg = wg_layout.pack(processor_id=processor_id,
                                local_memory=local if exp.local_memory_pages else 0,
                                local_memory_size=exp.local_memory_size)
            block[:len(wg)] = wg
            be.write(scratch, block)
            ids = struct.Struct("<IIH")
            write, call, fn, env = be.write, be.call, exp.address, self._env
            for z, y, x in itertools.product(range(wc[2]), range(wc[1]),
                                             range(wc[0])):
                write(wg_addr, ids.pack(x, y, z))
                ret = call(fn, env, state_addr, wg_addr)
                if ret & 0xFFFFFFFF:
                    raise DispatchError(
                        f"export {exp.label} returned {as_int32(ret)} in "
                        f"workgroup ({x}, {y}, {z})", name=self.path,
                        field="workgroup_id", value=(x, y, z))
        finally:
            for finish in finishers:
                finish()
            if scratch is not None:
                be.release(scratch)

    # --- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Unload the library (and its backend when this object created it)."""
        for addr in self._allocs:
            self.backend.release(addr)
        self._allocs = []
        self.module.close()
        if self._owns_backend:
            self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<Executable {self.name} {self.arch.name} ({self.backend.kind}) "
                f"exports={[e.label for e in self.exports]}>")
