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

import ctypes
import os
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

import elfloader
from elfloader import Backend

from . import abi, runtime
from .arrays import BINDING_ALIGNMENT, COPY_WARN_BYTES, AlignmentCopyWarning
from .dispatch import FIRST_CHUNK, SHARE_SECONDS, DispatchLayout, check_return, cpu_leases, run_grid
from .errors import DispatchError, ExportNotFoundError, LibraryError, UnresolvedImportError
from .memory import GuestView, ptr_array

_get_ident = threading.get_ident
_perf_counter = time.perf_counter
_ndarray = np.ndarray
_KEY_TYPES = (int, str)
_from_buffer = ctypes.c_char.from_buffer
_addressof = ctypes.addressof


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
    if type(value) is np.ndarray and value.flags.c_contiguous:
        return value
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


def _shared_ranges(arrays: list) -> tuple[dict, list] | None:
    """Bindings whose memory overlaps another binding's.

    Returns None when no two arrays can share memory (the common case,
    decided from their ``base`` objects: views of one numpy array or one
    buffer object), else ``(members, groups)``: ``groups`` lists the
    ``(start address, size, writable)`` host range of each set of
    overlapping arrays, ``members`` maps the index of every array in such a
    set to ``(group index, byte offset of the array within the range)``."""
    # Two views of one base, or a view and the array it was taken from,
    # repeat an id among the arrays and their bases.
    keys = [id(a) for a in arrays]
    keys += [id(b) for b in [a.base for a in arrays] if b is not None]
    if len(set(keys)) == len(keys):
        return None
    spans = sorted((a.__array_interface__["data"][0], a.nbytes, i)
                   for i, a in enumerate(arrays) if a.nbytes)
    merged: list[list] = []
    for start, size, i in spans:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], start + size)
            merged[-1][2].append((i, start))
        else:
            merged.append([start, start + size, [(i, start)]])
    found, groups = {}, []
    for start, end, members in merged:
        if len(members) < 2:
            continue
        writable = all(arrays[i].flags.writeable for i, _ in members)
        for i, first in members:
            found[i] = (len(groups), first - start)
        groups.append((start, end - start, writable))
    return (found, groups) if found else None


#: Default limit, in seconds, on each guest call made while loading
#: (initializers, the query, plugin functions); dispatches have none unless
#: ``timeout=`` is given to :meth:`Executable.dispatch`.
LOAD_TIMEOUT = 60.0
#: Most executable-level constants a library may declare.
MAX_EXECUTABLE_CONSTANTS = 1 << 16


#: Every open :class:`Executable`, for the fork handler.
_LIVE: "weakref.WeakSet[Executable]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for exe in list(_LIVE):
        exe._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


#: Largest time limit accepted, in seconds (a day).
MAX_TIMEOUT = 86400.0


def check_timeout(value, field: str, path: str | None, error=None) -> float:
    """``value`` as seconds: None or 0 (no limit) gives 0.0, else a finite
    number in (0, :data:`MAX_TIMEOUT`].

    Raises:
        DispatchError (or ``error``): anything else (negative, inf, nan, a
            string...)."""
    if value is None:
        return 0.0
    try:
        ok = (not isinstance(value, (bool, str, bytes))
              and 0 <= float(value) <= MAX_TIMEOUT)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise (error or DispatchError)(
            f"{value!r} is not a time limit in seconds (0 or None: no limit; "
            f"at most {MAX_TIMEOUT:g})", name=path, field=field, value=value)
    return float(value)


def _triple(values, field: str, path: str, limit_xy: int, low: int):
    """Three integers (x, y, z) with low <= x, y < limit_xy, low <= z < 2**16."""
    if type(values) is tuple and len(values) == 3:
        x, y, z = values
        if (type(x) is int and type(y) is int and type(z) is int and
                low <= x < limit_xy and low <= y < limit_xy and low <= z < 65536):
            return values
    try:
        vals = tuple(values)
        ok = len(vals) == 3 and all(isinstance(v, (int, np.integer))
                                    and not isinstance(v, bool) for v in vals)
    except TypeError:
        ok = False
    if not ok:
        raise DispatchError(f"{values!r} is not three integers (x, y, z)",
                            name=path, field=field, value=values)
    for axis, v, limit in zip("xyz", vals, (limit_xy, limit_xy, 1 << 16)):
        if not low <= v < limit:
            raise DispatchError(f"{axis} = {v} is outside [{low}, {limit})",
                                name=path, field=f"{field}.{axis}", value=int(v))
    return tuple(int(v) for v in vals)


def _constants(constants, exp, path: str) -> list[int]:
    consts = list(constants)
    if not exp.constant_count <= len(consts) <= abi.MAX_CONSTANT_COUNT:
        raise DispatchError(f"export {exp.label} declares {exp.constant_count} "
                            f"constants (at most {abi.MAX_CONSTANT_COUNT}), "
                            f"{len(consts)} given", name=path, field="constants",
                            value=len(consts))
    if all(type(c) is int and 0 <= c < 1 << 32 for c in consts):
        return consts
    for i, c in enumerate(consts):
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) \
                or not 0 <= c < 1 << 32:
            raise DispatchError(f"{c!r} is not a uint32 (pass float constants "
                                "as their bit pattern)", name=path,
                                field=f"constants[{i}]", value=c)
    return [int(c) for c in consts]


def host_workers() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _workers(workers, total: int, path: str, default: int) -> int:
    if workers is None:
        workers = default
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DispatchError(f"{workers!r} is not a positive number of workers",
                            name=path, field="workers", value=workers)
    return max(1, min(workers, total, 255))


def _int_triple(values: tuple) -> bool:
    """Whether the three values are ints (not bools, floats, numpy ints)."""
    x, y, z = values
    return type(x) is int and type(y) is int and type(z) is int


class _Quick:
    """What :meth:`Executable.dispatch` validated for a small native
    dispatch, to repeat it (:meth:`Executable._repeat`)."""

    __slots__ = ("grid", "workers_arg", "n", "key", "ordinal",
                 "label", "constants", "constant_count", "consts", "wc",
                 "wsize", "total", "shares", "pool", "slow")


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
        timeout: limit in seconds on each guest call while loading
            (initializers, the query, plugin functions; emulated backend;
            0: none; at most :data:`MAX_TIMEOUT`). Default
            :data:`LOAD_TIMEOUT` (60 s).
        initialize: run the file's initializers (False for inspection).
        bind_imports: resolve imports and build the environment (False for
            inspection: the library cannot be dispatched then).
        engine: emulation engine of a new emulated backend: ``"auto"``
            (qemu-user where installed, else unicorn), ``"qemu"``,
            ``"unicorn"``.
        cpu: CPU profile the emulated CPU models (``fatelf.arches.PROFILES``,
            e.g. ``"x86-64-v3"``, ``"sve"``, ``"rv64gcv"``); None: the
            engine's most capable model. Selects the emulated backend under
            ``backend="auto"``.
        vlen: vector length in bits for a scalable profile (SVE VL, RVV
            VLEN).

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
                 timeout: float = LOAD_TIMEOUT, initialize: bool = True,
                 bind_imports: bool = True, engine: str | None = None,
                 cpu: str | None = None, vlen: int | None = None):
        timeout = check_timeout(timeout, "timeout", None, LibraryError)
        if plugins is not None:
            backend = plugins.backend
        # Dispatches may run on several threads at once: each takes a
        # layout from the pool of its key (export, counts, workers) under
        # the lock; close() waits until none runs.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running: list[int] = []     # thread ids of running dispatches
        self._closed = True               # until loaded
        self._released = False
        self._layouts: dict[tuple, list[DispatchLayout]] = {}
        # export key -> _Quick: a validated small native dispatch to repeat
        self._quick: dict = {}
        self._leases = None
        self._copy_warned: set[int] = set()
        # export ordinal -> seconds per workgroup in its last dispatch with
        # the default workers (decides whether the next one shares)
        self._pace: dict[int, float] = {}
        # export ordinal -> seconds per workgroup measured in its last
        # one-worker dispatch with the default workers: the pace kept is
        # the smaller of the last two such, so that one dispatch slowed
        # down from outside (the thread preempted, a garbage collection)
        # does not make the next one share a small grid. (A repeated
        # dispatch, Executable._repeat, notes its pace only when it or the
        # one before it took longer than SHARE_SECONDS.)
        self._timed: dict[int, float] = {}
        self._allocs: list[int] = []
        self.last_workers = 0
        self._default_workers = host_workers()
        self.imports: list[str] = []
        self.exports: list[Export] = []
        self.import_functions: dict[str, int] = {}
        self.plugins = None
        if isinstance(backend, Backend):
            with backend.time_limit(timeout):
                self.module = elfloader.load(source, arch=arch, backend=backend,
                                             initialize=initialize)
        else:
            emulation = {k: v for k, v in (("engine", engine), ("cpu", cpu),
                                           ("vlen", vlen)) if v is not None}
            image = elfloader.read_image(source, arch=arch)
            own = elfloader.open_backend(image.arch, backend, **emulation)
            try:
                with own.time_limit(timeout):
                    self.module = elfloader.load(image, backend=own,
                                                 initialize=initialize)
            except BaseException:
                own.close()
                raise
        self._owns_backend = not isinstance(backend, Backend)
        self.backend: Backend = self.module.backend
        # Natively aligned writable bindings are used in place (no copies).
        self._in_place = getattr(self.backend, "kind", "") == "native"
        self.arch = self.module.arch
        self.path = self.module.name
        try:
            with self.backend.time_limit(timeout):
                self._query(plugins if bind_imports else None, bind_imports)
        except BaseException:
            self._closed = False
            self.close()
            raise
        self._leases = cpu_leases(self.backend)
        self._first_chunk = FIRST_CHUNK.get(self.backend.kind, 1)
        self._closed = False
        _LIVE.add(self)

    # --- loading ----------------------------------------------------------
    def _alloc(self, data: bytes) -> int:
        addr = self.backend.alloc_bytes(data)
        self._allocs.append(addr)
        return addr

    def _query(self, plugins, bind_imports: bool) -> None:
        be = self.backend
        mod = self.module
        view = self.view = GuestView(be, mod, self.path)
        query = mod.lookup(abi.LIBRARY_QUERY)
        view.check_code(query, abi.LIBRARY_QUERY)
        env_layout = abi.ENVIRONMENT.layout(*be.arch.c_abi)
        self._env = self._alloc(bytes(env_layout.size))
        try:
            result = be.call(query, abi.LIBRARY_VERSION, self._env)
        except elfloader.EmulationError as exc:
            from .faults import call_fault
            raise call_fault(exc, be, [mod] + [
                p.module for p in getattr(plugins, "plugins", ())
                if getattr(p, "module", None) is not None],
                abi.LIBRARY_QUERY, "library function") from None
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
        if self.constant_count > MAX_EXECUTABLE_CONSTANTS:
            raise LibraryError(f"{self.constant_count} executable constants exceed "
                               f"the limit of {MAX_EXECUTABLE_CONSTANTS}",
                               name=self.path, field="constants.count",
                               value=self.constant_count)
        n = lib["imports.count"]
        if n > 4096:
            raise LibraryError(f"{n} imports", name=self.path,
                               field="imports.count", value=n)
        self.imports = [view.string(p, f"imports.symbols[{i}]", False) for i, p in
                        enumerate(view.array("ptr", lib["imports.symbols"], n,
                                             "imports.symbols"))]
        self.exports = self._read_exports(lib)
        self._export_cache = {e.ordinal: e for e in self.exports}
        self._export_cache.update({e.name: e for e in self.exports if e.name})
        if bind_imports:
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
        #: resolved import name -> function address (0: optional, missing)
        self.import_functions = dict(zip(names, funcs))
        #: the plugin manager the imports were resolved through, or None
        self.plugins = plugins
        thunk = be.place_code(self.arch.import_thunk) if names else 0
        if thunk:
            self._allocs.append(thunk)
        constants = self._alloc(bytes(4 * max(self.constant_count, 1)))
        env = abi.ENVIRONMENT.layout(*be.arch.c_abi).pack(
            constants=constants, import_thunk=thunk,
            import_funcs=self._alloc(ptr_array(ps, funcs)) if names else 0,
            import_contexts=self._alloc(ptr_array(ps, contexts)) if names else 0)
        be.write(self._env, env)

    @property
    def environment(self) -> int:
        """Address of the executable's environment in its backend's memory
        (the environment argument of its dispatch functions)."""
        return self._env

    # --- dispatch ---------------------------------------------------------
    def export(self, key: int | str) -> Export:
        """The export with ordinal ``key`` (int) or name ``key`` (str).

        Raises:
            ExportNotFoundError: no such export; lists the available names.
            LibraryError: the executable was closed (its addresses are gone).
        """
        if self._closed:
            raise LibraryError("the executable is closed", name=self.path,
                               field="export", value=key)
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
                 workers: int | None = None, timeout: float | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        """Run every workgroup of the grid.

        On the native backend the kernel's machine code runs in this
        process, on this process's threads: a kernel that faults (bad
        pointer, invalid instruction) ends the interpreter with a signal
        (SIGSEGV, SIGILL, SIGBUS) and no exception can be raised. Dispatch
        untrusted kernels emulated, or in a child process as ``hal-cpu
        run`` does (:func:`hal_cpu.isolate.run_in_child`, which raises
        :class:`hal_cpu.NativeCrashError` instead).

        Args:
            export: ordinal or name.
            workgroup_count: (x, y, z), x, y < 2**32, z < 2**16; a zero
                count runs no workgroup.
            bindings: C-contiguous numpy arrays (any dtype) or buffers
                (``bytes``, ``bytearray``...), in binding order; results land
                in them. Every binding the kernel sees is 64-byte aligned:
                natively an aligned writable array is used in place, any
                other is copied into aligned memory (and back if writable).
                Bindings that overlap in memory (views of one buffer) are
                mapped as one range, so the kernel sees them overlap as
                they do on the host; if any of them is read-only the range
                is not copied back.
                Read-only arrays and ``bytes`` are never written.
            constants: uint32 push constants (ints in [0, 2**32)).
            workgroup_size: override of the export's (x, y, z) (each in
                [1, 2**32), z < 2**16).
            workers: host threads running workgroups at once (under
                emulation each has its own CPU sharing the guest memory).
                Default: one when the grid is small (a single crossing of
                at most 256 workgroups natively, or an export whose last
                dispatches took under :data:`hal_cpu.dispatch.SHARE_SECONDS`
                for the grid), else the CPUs this process may use. Each worker has its own workgroup
                state, ``processor_id`` (0..workers-1) and local memory;
                ``max_concurrency`` in the dispatch state says how many.
            timeout: seconds after which no further workgroup starts
                (checked between chunks of workgroups; under emulation also
                the limit of each crossing into guest code); None or 0: no
                limit; a finite number up to :data:`MAX_TIMEOUT`.
            progress: called as ``progress(done, total)`` (workgroups) after
                each chunk.

        Raises:
            DispatchError: bad arguments (fewer bindings/constants than the
                export declares, counts out of range, non-integer
                constants), or a workgroup returned non-zero (the message
                names the export and the workgroup id).
            DispatchTimeoutError: ``timeout`` passed.
            LibraryError: the executable was closed.
            BindingOverrunError: under emulation, the kernel wrote past the
                end of a binding (into the canary bytes after it, seen when
                the dispatch ends), or read or wrote its guard page (the
                message is the fault report).
            LocalMemoryOverrunError: the same for workgroup-local memory.
            elfloader.EmulationError: the emulated CPU faulted (the message
                is a fault report naming the worker's workgroup).
        """
        quick = (self._quick.get(export) if type(export) in _KEY_TYPES
                 and workgroup_size is None else None)
        if (quick is not None
                and (quick.grid is workgroup_count
                     or type(workgroup_count) is tuple
                     and workgroup_count == quick.grid
                     and _int_triple(workgroup_count))
                and workers is quick.workers_arg and not timeout
                and progress is None and len(bindings) == quick.n
                and (constants is quick.constants or not constants
                     and not quick.constant_count)
                and not self._closed):
            done = self._repeat(quick, bindings)
            if done:
                return
        if self._closed:
            raise LibraryError("the executable is closed", name=self.path,
                               field="dispatch", value=export)
        exp = self._export_cache.get(export) if type(export) in (int, str) else None
        if exp is None:
            exp = self.export(export)
        wc = _triple(workgroup_count, "workgroup_count", self.path, 1 << 32, 0)
        wsize = (_triple(workgroup_size, "workgroup_size", self.path, 1 << 32, 1)
                 if workgroup_size is not None else exp.workgroup_size)
        n = len(bindings)
        if n < exp.binding_count or n > abi.MAX_BINDING_COUNT:
            raise DispatchError(f"export {exp.label} declares {exp.binding_count} "
                                f"bindings (at most {abi.MAX_BINDING_COUNT}), "
                                f"{n} given", name=self.path, field="bindings",
                                value=n)
        consts = (constants if not constants and not exp.constant_count
                  else _constants(constants, exp, self.path))
        total = wc[0] * wc[1] * wc[2]
        if total == 0:
            return  # an empty grid runs nothing, as in IREE
        if total > runtime.MAX_END:
            raise DispatchError(f"{total} workgroups exceed the 2**64 - 1 a "
                                "dispatch can run", name=self.path,
                                field="workgroup_count", value=wc)
        timed = False
        workers_arg = workers
        if workers is None:
            # Default: one worker unless the grid takes long enough (by the
            # export's pace in earlier dispatches) to pay for sharing it.
            workers = 1
            if total > 1 and self._default_workers > 1:
                pace = self._pace.get(exp.ordinal)
                if (pace * total > SHARE_SECONDS if pace is not None
                        else total > self._first_chunk):
                    workers = min(self._default_workers, total, 255)
                else:
                    timed = True
        elif type(workers) is int and workers > 0:
            workers = min(workers, total, 255)
        else:
            workers = _workers(workers, total, self.path, self._default_workers)
        self.last_workers = workers
        key = (exp.ordinal, n, len(consts), workers)
        # No lock on this path (each step is atomic under the GIL): this
        # dispatch counts as running before it checks for close(), which
        # marks the executable closed before it looks for running ones.
        me = _get_ident()
        self._running.append(me)
        if self._closed:
            self._end_dispatch(me, key, None)
            raise LibraryError("the executable is closed", name=self.path,
                               field="dispatch", value=export)
        try:
            layout = self._layouts[key].pop()
        except (KeyError, IndexError):
            layout = None
        first_cpu = None
        finishers = pointers = lengths = None
        ran = False
        try:
            if layout is None:
                layout = DispatchLayout(self.backend, n, len(consts), workers,
                                        exp.local_memory_size)
                layout.calls(exp.address, self._env)
            if self._leases is not None:
                # Emulated: this dispatch's workers get CPUs of their own.
                first_cpu = self._leases.take(workers)
                layout.calls(exp.address, self._env, first_cpu)
            if self._in_place:
                # Natively, aligned writable arrays are used where they are.
                pointers, lengths = [], []
                map_array = self.backend.map_array
                for i, a in enumerate(bindings):
                    if type(a) is not np.ndarray or not a.flags.c_contiguous:
                        a = _as_binding(a, i)
                    address, finish = map_array(a)
                    pointers.append(address)
                    lengths.append(a.nbytes)
                    if finish is not None:
                        if finishers is None:
                            finishers = []
                        finishers.append(finish)
                if finishers is not None:
                    self._note_copies(exp, bindings)
                    if n > 1:
                        # Some were copied: copies of overlapping bindings
                        # must be one copy. Nothing ran yet, so the copies
                        # go back unchanged and the bindings are mapped
                        # again.
                        for finish in finishers:
                            finish()
                        finishers = []
                        pointers, lengths = self._map_copied(bindings,
                                                             finishers)
            else:
                finishers = []
                pointers, lengths = self._map_copied(bindings, finishers)
            if timed:
                started = _perf_counter()
            layout.write(wsize, wc, workers, consts, pointers, lengths, total)
            if timeout or progress is not None or getattr(
                    self.backend, "timeout_us", 0):
                # (the emulated backend may carry a per-call limit)
                self._run_limited(layout, exp, total, wc, timeout, progress,
                                  pointers, lengths)
            else:
                try:
                    # (run_grid, minus its set-up, for a grid of one crossing)
                    if total <= layout.whole:
                        layout.run_whole(total, wc, exp.label, self.path)
                    else:
                        run_grid(self.backend, layout, exp.address, self._env,
                                 total, label=exp.label, path=self.path, grid=wc)
                except elfloader.EmulationError as exc:
                    raise self._fault(exc, exp, pointers, lengths, layout) from None
            ran = True
            if timed:
                self._note_pace(exp.ordinal,
                                (_perf_counter() - started) / total)
            elif layout.per_workgroup is not None and workers > 1:
                self._pace[exp.ordinal] = layout.per_workgroup
            if (finishers is None and workers == 1 and total <= layout.whole
                    and self._in_place and workgroup_size is None
                    and not timeout and progress is None
                    and type(export) in (int, str)
                    and type(workgroup_count) is tuple
                    and (not consts or type(constants) is tuple)
                    and not getattr(self.backend, "timeout_us", 0)):
                self._remember(export, exp, workgroup_count, wc, total, key,
                               constants, consts, timed, workers_arg)
        finally:
            try:
                if finishers is not None:
                    self._finish(finishers, ran, exp, pointers, lengths)
            finally:
                if first_cpu is not None:
                    self._leases.give(first_cpu, workers)
                self._running.remove(me)
                if layout is not None:
                    self._layouts.setdefault(key, []).append(layout)
                if self._closed:
                    self._end_dispatch(me, key, None, False)

    def _note_pace(self, ordinal: int, pace: float) -> None:
        """Keep ``pace`` (seconds per workgroup of a one-worker dispatch
        with the default workers): the export's pace becomes the smaller of
        it and the one measured before."""
        last = self._timed.get(ordinal, pace)
        self._timed[ordinal] = pace
        self._pace[ordinal] = min(pace, last)

    def _remember(self, export, exp: Export, grid: tuple, wc, total: int,
                  key, constants, consts, timed: bool, workers_arg) -> None:
        """Keep what a small native dispatch that ran in place validated,
        for :meth:`_repeat` (one per export key: the last grid)."""
        q = _Quick()
        q.grid, q.workers_arg = grid, workers_arg
        q.n, q.key, q.ordinal, q.label = key[1], key, exp.ordinal, exp.label
        q.constants = constants if consts else None
        q.constant_count, q.consts = len(consts), consts
        q.wc, q.wsize, q.total = wc, exp.workgroup_size, total
        # (the pool of layouts for the key; an executable's pools live as
        # long as it is open)
        q.pool = self._layouts.setdefault(key, [])
        # Default workers on a grid that could be shared: the export's pace
        # decides, as in dispatch().
        q.shares = workers_arg is None and total > 1 and self._default_workers > 1
        q.slow = True      # (the next repeat notes its pace)
        assert not q.shares or timed
        self._quick[export] = q

    def _repeat(self, q: "_Quick", bindings) -> bool:
        """Run a dispatch with the export, grid (the same tuple, or an equal
        tuple of ints), workers argument and constants object of ``q`` (a
        dispatch :meth:`dispatch` validated and ran in one crossing,
        natively, bindings in place) when it is exactly that again: every
        binding a numpy array the native backend uses in
        place (writable, C-contiguous, not empty, at a 64-byte aligned
        address: checked for each call), the layout pool not empty, the
        default worker count still 1. Returns False (nothing done) when it
        is not, for :meth:`dispatch` to take its general path."""
        pointers, lengths = [], []
        for a in bindings:
            if type(a) is not _ndarray:
                return False
            try:
                # Writable, C-contiguous and not empty (as map_array checks).
                address = _addressof(_from_buffer(a))
            except (TypeError, ValueError):
                return False
            if address % BINDING_ALIGNMENT:
                return False
            pointers.append(address)
            lengths.append(a.nbytes)
        if self.backend._closed:
            return False
        shares = q.shares
        if shares:
            pace = self._pace.get(q.ordinal)
            if pace is not None and pace * q.total > SHARE_SECONDS:
                return False
        me = _get_ident()
        self._running.append(me)
        if self._closed:
            self._end_dispatch(me, q.key, None)
            return False
        pool = q.pool
        try:
            layout = pool.pop()
        except IndexError:
            self._end_dispatch(me, q.key, None)
            return False
        try:
            self.last_workers = 1
            if shares:
                started = _perf_counter()
            layout.write_again(q, pointers, lengths)
            ret = layout.loops[0]()
            if ret:
                check_return(layout, ret, q.total, q.wc, q.label, self.path)
            if layout.local_checks:
                layout.check_local(q.label, self.path)
            if shares:
                # Only a slow dispatch, or the first fast one after it, can
                # change whether the next one shares: the pace is noted
                # then (in between, the pace noted last is a fast one).
                elapsed = _perf_counter() - started
                if elapsed > SHARE_SECONDS or q.slow:
                    q.slow = elapsed > SHARE_SECONDS
                    self._note_pace(q.ordinal, elapsed / q.total)
        finally:
            self._running.remove(me)
            pool.append(layout)
            if self._closed:
                self._end_dispatch(me, q.key, None, False)
        return True

    def _note_copies(self, exp: Export, bindings) -> None:
        """Warn (once per export) when a binding over
        :data:`hal_cpu.arrays.COPY_WARN_BYTES` is copied because it is not
        64-byte aligned."""
        if exp.ordinal in self._copy_warned:
            return
        for i, a in enumerate(bindings):
            a = _as_binding(a, i)
            address = a.__array_interface__["data"][0]
            if a.nbytes > COPY_WARN_BYTES and address % BINDING_ALIGNMENT:
                self._copy_warned.add(exp.ordinal)
                warnings.warn(AlignmentCopyWarning(
                    f"{self.path}: binding {i} of export {exp.label} "
                    f"({a.nbytes} bytes at an address {address % 64} bytes "
                    "past a 64-byte boundary) is copied in and out on every "
                    "dispatch; make it with hal_cpu.empty/zeros/full/asarray "
                    "to have it used in place"), stacklevel=3)
                return

    def _end_dispatch(self, me: int, key, layout, counted: bool = True) -> None:
        """Give ``layout`` back to its pool and stop counting the dispatch
        (unless ``counted`` is False: done already); the last dispatch to
        end after :meth:`close` was called frees the executable."""
        if counted:
            self._running.remove(me)
        if layout is not None:
            self._layouts.setdefault(key, []).append(layout)
        if self._closed and not self._running:
            with self._lock:
                self._idle.notify_all()
                if self._released or self._running:
                    return
                self._released = True
            self._release()

    def _finish(self, finishers, ran: bool, exp, pointers, lengths) -> None:
        """Run every binding's finisher (copy-back, canary check); after a
        dispatch that ran, a canary found overwritten raises.

        Raises:
            BindingOverrunError: the kernel wrote past a binding's end."""
        overrun = None
        for finish in finishers:
            try:
                finish()
            except elfloader.GuardError as exc:
                overrun = overrun or exc
        if overrun is not None and ran:
            from .faults import binding_overrun
            raise binding_overrun(overrun, self, exp, pointers,
                                  lengths) from None

    def _map_copied(self, bindings, finishers: list) -> tuple[list, list]:
        """Map the bindings when (some of) them are copied: overlapping
        bindings (views of one buffer) are mapped as one range, so the
        kernel sees them overlap as they do on the host and no copy-back
        overwrites another's results. Returns (pointers, lengths); each
        mapping's finisher is appended to ``finishers`` as it is made."""
        arrays = [_as_binding(b, i) for i, b in enumerate(bindings)]
        shared = _shared_ranges(arrays) if len(arrays) > 1 else None
        pointers, lengths = [], []
        map_array = self.backend.map_array
        bases = []
        if shared is not None:
            members, groups = shared
            for start, size, writable in groups:
                whole = np.frombuffer((ctypes.c_uint8 * size).from_address(start),
                                      dtype=np.uint8)
                whole.flags.writeable = writable
                address, finish = map_array(whole)
                bases.append(address)
                if finish is not None:
                    finishers.append(finish)
        for i, a in enumerate(arrays):
            if shared is not None and i in shared[0]:
                group, offset = shared[0][i]
                pointers.append(bases[group] + offset)
                lengths.append(a.nbytes)
                continue
            address, finish = map_array(a)
            pointers.append(address)
            lengths.append(a.nbytes)
            if finish is not None:
                finishers.append(finish)
        return pointers, lengths

    def _run_limited(self, layout, exp, total, wc, timeout, progress,
                     pointers, lengths) -> None:
        """run_grid with a time limit (``timeout`` seconds, or none) on every
        guest call and between chunks, and progress reports."""
        timeout = check_timeout(timeout, "timeout", self.path)
        deadline = time.monotonic() + timeout if timeout else None
        with self.backend.time_limit(timeout or 0):
            try:
                run_grid(self.backend, layout, exp.address, self._env, total,
                         label=exp.label, path=self.path, grid=wc,
                         deadline=deadline, progress=progress)
            except elfloader.EmulationError as exc:
                raise self._fault(exc, exp, pointers, lengths, layout) from None

    def _fault(self, exc, exp, pointers, lengths, layout):
        from .faults import dispatch_fault
        return dispatch_fault(exc, self, exp, pointers, lengths, layout)

    # --- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Unload the library (and its backend when this object created it);
        closing again does nothing. Dispatches running on other threads
        finish first (close waits for them; a dispatch that starts
        afterwards raises :class:`LibraryError`); called from inside a
        dispatch of this executable (a progress callback), it returns at
        once and the library is freed when the last dispatch ends.
        Afterwards :meth:`dispatch`, :meth:`export` and entering a
        ``with`` block raise :class:`LibraryError`, and so does every use of
        the backend this object created (``read``, ``write``, ``call``...:
        :class:`elfloader.BackendError`); the metadata read at load time
        (``name``, ``exports``, ``imports``...) stays readable."""
        if not hasattr(self, "_lock"):
            return
        me = _get_ident()
        with self._lock:
            if self._released:
                return
            self._closed = True
            if me in self._running:
                return              # the last dispatch to end frees it
            while self._running:
                # (a dispatch ending without the lock may miss the wait)
                self._idle.wait(0.01)
            if self._released:
                return
            self._released = True
        self._release()

    def _release(self) -> None:
        """Free the layouts, allocations, module and (owned) backend; no
        dispatch runs."""
        _LIVE.discard(self)
        self._quick = {}
        for pool in self._layouts.values():
            for layout in pool:
                layout.close()
        self._layouts = {}
        if not hasattr(self, "module"):
            return
        for addr in self._allocs:
            self.backend.release(addr)
        self._allocs = []
        self.module.close()
        if self._owns_backend:
            self.backend.close()

    def _after_fork(self) -> None:
        """In a forked child: new locks (one held by a thread of the parent
        would never be released); dispatches of other threads never end
        there, so only this thread's stay counted."""
        me = _get_ident()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = [t for t in self._running if t == me]

    def __enter__(self):
        """Returns the executable; :meth:`close` runs on leaving the block.

        Raises:
            LibraryError: the executable was closed.
        """
        if self._closed:
            raise LibraryError("the executable is closed", name=self.path,
                               field="enter", value=None)
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        closed = " closed" if self._closed else ""
        return (f"<Executable {self.name} {self.arch.name} ({self.backend.kind})"
                f"{closed} exports={[e.label for e in self.exports]}>")
