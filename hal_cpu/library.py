"""Executable libraries: query, exports, imports and workgroup dispatch.

An executable library is the ELF that ``iree-compile`` embeds for the
llvm-cpu backend. Its exported ``iree_hal_executable_library_query`` returns
the library struct (iree/hal/local/executable_library.h, v0.6): a header
(name, features, sanitizer), an import table, an export table (dispatch
function pointers with their attrs, names and tags) and the executable
constant count. :class:`Executable` loads it with :mod:`elfloader` and runs
each workgroup of a 3-D grid with the environment, dispatch state and
workgroup state laid out for the image's pointer width.

A dispatch is made of parts in modules of their own: the checks of its
arguments, its worker count and the one engine that runs it,
:class:`~hal_cpu.dispatch_policy.PreparedDispatch` (what
:meth:`Executable.prepare` returns and :meth:`Executable.dispatch` runs;
:mod:`hal_cpu.dispatch_policy`, whose policy is the base class of
:class:`Executable`), the mapping of its bindings
(:mod:`hal_cpu.bindings`), and the layouts and workgroup loop
(:mod:`hal_cpu.dispatch`).
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence, cast

import numpy as np

import elfloader
from elfloader import Backend
from fatelf.text import printable

from . import abi, empty_functions
from .dispatch import DispatchLayout
from .dispatch_policy import (
    DispatchPolicy,
    PreparedDispatch,
    check_timeout,
    check_workers,
    is_int_triple,
)
from .errors import DispatchError, ExportNotFoundError, LibraryError, UnresolvedImportError
from .memory import GuestView, ptr_array

_get_ident = threading.get_ident
_KEY_TYPES = (int, str)


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

    @functools.cached_property
    def label(self) -> str:
        """The export as messages show it: its name (the file's text,
        escaped on one bounded line: :func:`fatelf.text.printable`), or
        ``#ordinal`` when the library strips names. Made once (dispatches
        name their export in every progress note)."""
        return (printable(self.name, 200) if self.name is not None
                else f"#{self.ordinal}")


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
        exe.reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Executable(DispatchPolicy):
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
            0: none; at most :data:`hal_cpu.dispatch_policy.MAX_TIMEOUT`). Default
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
        #: thread ids of the dispatches running now
        self.running: list[int] = []
        #: whether :meth:`close` was called (no dispatch may start; read it,
        #: never set it)
        self.closed = True               # until loaded
        self._released = False
        self._layouts: dict[tuple, list[DispatchLayout]] = {}
        self._allocs: list[int] = []
        self.last_workers = 0
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
        self.arch = self.module.arch
        self.path = self.module.name
        try:
            with self.backend.time_limit(timeout):
                self._query(plugins if bind_imports else None, bind_imports)
            empty_functions.check_library(self)  # 32-bit: iree-compile's empty libm
        except BaseException:
            self.closed = False
            self.close()
            raise
        self._init_policy(self.backend.kind)
        self.closed = False
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
        # (not optional: a string or an error)
        self.imports = [cast(str, view.string(p, f"imports.symbols[{i}]", False))
                        for i, p in enumerate(view.array(
                            "ptr", lib["imports.symbols"], n, "imports.symbols"))]
        self.exports = self._read_exports(lib)
        self._export_cache: dict[int | str, Export] = {
            e.ordinal: e for e in self.exports}
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
                    f"unresolved imports {printable(', '.join(missing))}; no plugins were "
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
        if self.closed:
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
            f"no export {printable(repr(key), 200)}; exports: "
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
                Read-only arrays and ``bytes`` are never written. Or, all
                of them, ``(address, length)`` pairs of host memory in
                bytes (see :meth:`prepare`).
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
                limit; a finite number up to :data:`hal_cpu.dispatch_policy.MAX_TIMEOUT`.
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
                and (quick.grid_arg is workgroup_count
                     or type(workgroup_count) is tuple
                     and workgroup_count == quick.wc
                     and is_int_triple(workgroup_count))
                and workers is quick.workers_arg and not timeout
                and progress is None and len(bindings) == quick.binding_count
                and (constants is quick.constants_arg or not constants
                     and not quick.constant_count)
                and not self.closed and self._repeat(quick, bindings)):
            return
        # A general-path dispatch checked once is kept by its arguments
        # (plain ints only, so that equal keys mean equal checks).
        key: tuple | None = None
        prepared = None
        if (type(export) in _KEY_TYPES and workgroup_size is None
                and type(workgroup_count) in (tuple, list) and len(workgroup_count) == 3
                and is_int_triple(workgroup_count)
                and type(constants) in (tuple, list) and len(constants) <= 64
                and all(type(c) is int for c in constants)
                and (workers is None or type(workers) is int)):
            key = (export, tuple(workgroup_count), tuple(constants), len(bindings),
                   workers)
            prepared = self.prepared_calls.get(key)
            if prepared is not None and self.closed:
                prepared = None
        if prepared is None:
            prepared = self.prepare(export, workgroup_count, constants, len(bindings),
                                    workgroup_size=workgroup_size, workers=workers)
            if key is not None:
                if len(self.prepared_calls) >= 64:
                    self.prepared_calls.clear()
                self.prepared_calls[key] = prepared
        if not prepared.total:
            return  # an empty grid runs nothing, as in IREE
        if prepared.binding_count and type(bindings[0]) is tuple:
            prepared.run(bindings, timeout=timeout, progress=progress)
            return
        in_place = prepared.run_mapped(bindings, timeout, progress)
        if (in_place and prepared.native and self.last_workers == 1
                and prepared.total <= self.first_chunk
                and workgroup_size is None and not timeout and progress is None
                and type(export) in _KEY_TYPES
                and type(workgroup_count) is tuple
                and (not prepared.consts or type(constants) is tuple)
                and not self.backend.timeout_us):
            # Kept for the repeat path: the same export key, grid, workers
            # argument and constants object run again by prepared.repeat.
            prepared.grid_arg = workgroup_count
            prepared.constants_arg = constants if prepared.consts else None
            self._quick[export] = prepared

    def prepare(self, export: int | str,
                workgroup_count: Sequence[int] = (1, 1, 1),
                constants: Sequence[int] = (),
                bindings: int | Sequence[int] = 0, *,
                workgroup_size: Sequence[int] | None = None,
                workers: int | None = None) -> PreparedDispatch:
        """A dispatch of ``export`` checked once, to run many times on
        different bindings (:class:`hal_cpu.dispatch_policy.PreparedDispatch`:
        ``run(bindings)`` with arrays or ``(address, length)`` pairs,
        ``run_addresses(pointers, lengths)``). It lays out the dispatch
        state, constants and binding arrays of
        iree/hal/local/executable_library.h (v0.6) once per layout and
        rewrites only the binding pointers and lengths per run.

        Args:
            export: ordinal or name.
            workgroup_count: (x, y, z) workgroups, as for :meth:`dispatch`.
            constants: uint32 push constants.
            bindings: how many bindings each run passes (an int), or the
                byte length of each (a sequence: the lengths
                ``run_addresses`` uses by default, and under emulation the
                sizes of the guarded guest ranges it keeps).
            workgroup_size: override of the export's (x, y, z).
            workers: host threads per run (None: the default of
                :meth:`dispatch`, decided per run by the export's pace).

        Raises:
            DispatchError: as for :meth:`dispatch` (counts out of range,
                fewer bindings or constants than the export declares, a
                constant not a uint32, ``workers`` not a positive int, a
                length not a non-negative int).
            ExportNotFoundError: no such export.
            LibraryError: the executable was closed.
        """
        if self.closed:
            raise LibraryError("the executable is closed", name=self.path,
                               field="dispatch", value=export)
        exp = self._export_cache.get(export) if type(export) in _KEY_TYPES else None
        if exp is None:
            exp = self.export(export)
        lengths: list[int] | None = None
        if type(bindings) is int:
            n = bindings
        else:
            try:
                lengths = list(bindings)  # type: ignore[arg-type]
            except TypeError:
                lengths = None
            if lengths is None or not all(type(v) is int and 0 <= v < 1 << 63
                                          for v in lengths):
                raise DispatchError(f"{bindings!r} is neither a binding count "
                                    "nor a list of byte lengths", name=self.path,
                                    field="bindings", value=bindings)
            n = len(lengths)
        wc, wsize, consts, total = self._check_dispatch(
            exp, workgroup_count, workgroup_size, n, constants)
        if workers is not None and not (type(workers) is int and workers > 0):
            check_workers(workers, 1, self.path, 1)
        return PreparedDispatch(self, exp, wc, wsize, consts, total, n, lengths,
                                workers)

    def release_if_idle(self) -> None:
        """After :meth:`close` was called: free the executable when no
        dispatch runs any more (called by the last dispatch to end)."""
        if self.closed and not self.running:
            with self._lock:
                self._idle.notify_all()
                if self._released or self.running:
                    return
                self._released = True
            self._release()

    def keep_allocations(self, addresses: Sequence[int]) -> None:
        """Backend memory (``alloc``, ``alloc_guarded``) freed when the
        executable closes, unless :meth:`free_allocations` frees it
        first."""
        self._allocs.extend(addresses)

    def free_allocations(self, addresses: Sequence[int]) -> None:
        """Free memory given to :meth:`keep_allocations` now."""
        for address in addresses:
            if address in self._allocs:
                self._allocs.remove(address)
                self.backend.release(address)

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
            self.closed = True
            if me in self.running:
                return              # the last dispatch to end frees it
            while self.running:
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
        self.prepared_calls = {}
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

    def reset_after_fork(self) -> None:
        """In a forked child: new locks (one held by a thread of the parent
        would never be released); dispatches of other threads never end
        there, so only this thread's stay counted."""
        me = _get_ident()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # (in place: prepared dispatches hold the list)
        self.running[:] = [t for t in self.running if t == me]

    def __enter__(self):
        """Returns the executable; :meth:`close` runs on leaving the block.

        Raises:
            LibraryError: the executable was closed.
        """
        if self.closed:
            raise LibraryError("the executable is closed", name=self.path,
                               field="enter", value=None)
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        closed = " closed" if self.closed else ""
        return (f"<Executable {self.name} {self.arch.name} ({self.backend.kind})"
                f"{closed} exports={[e.label for e in self.exports]}>")
