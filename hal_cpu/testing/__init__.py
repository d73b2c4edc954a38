"""Testing plugins and executables without pytest: :class:`LoadedPlugin`
loads a plugin into its own backend for one architecture, places numpy
arrays between guard pages and calls its imports under a time limit (Ctrl-C
stops a call; natively, each call runs in a child process and a crash is
run again emulated for its report); :func:`guard_dispatch` gives an
executable's ``dispatch`` the same guards.

:mod:`hal_cpu.testing.pytest_plugin` builds its fixtures (``hal_plugin``,
``hal_executable``) on these; ``from hal_cpu.testing.pytest_plugin import
LoadedPlugin`` names the same class.
"""

from __future__ import annotations

import faulthandler
from typing import Mapping

import numpy as np

from fatelf import arches
from fatelf.errors import PortableKernelError

__all__ = ["DEFAULT_TIMEOUT", "LoadedPlugin", "MOST_WORKERS", "PARAMS_ALIGNMENT",
           "guard_dispatch", "hal_spelling", "reported", "with_emulated_run"]

#: Default limit on each guest call, seconds (``--hal-timeout``).
DEFAULT_TIMEOUT = 60.0


def hal_spelling(text: str) -> str:
    """``text`` (an engine's message) with the command line's options
    spelled as this plugin's: ``--hal-engine=qemu``."""
    return (text.replace("engine='qemu' (--engine=qemu)", "--hal-engine=qemu")
            .replace("--engine=", "--hal-engine="))


def reported(exc: BaseException) -> BaseException:
    """Mark ``exc`` to be shown as its report by the hook above (with the
    options a message suggests spelled as this plugin's)."""
    text = str(exc)
    spelled = hal_spelling(text)
    if spelled != text:
        exc.args = (spelled,)
        if isinstance(exc, PortableKernelError) and isinstance(exc.message, str):
            exc.message = hal_spelling(exc.message)
    try:
        # (any exception: the hook reads the mark with getattr)
        setattr(exc, "hal_report", True)
    except AttributeError:
        pass
    return exc


class LoadedPlugin:
    """A plugin loaded into its own backend for one architecture.

    Args:
        spec: a ``.sos`` bundle or a per-architecture ``.so``, with
            optional ``?key=value&...`` load parameters.
        arch: architecture name.
        backend: ``emulated`` or ``native`` (calls in a child process; a
            crash is run again emulated for its report).
        sandbox: natively, confine each call's child
            (:func:`hal_cpu.isolate.confinement`: the plugin cannot create
            or write files, open sockets or start processes; it may
            allocate, read the clock, run threads and print). False: the
            child runs with the caller's rights, as in-process native code
            does (it can do anything the caller can). The plugin's own load
            runs natively in this process (after a trial load in a
            confined child): load only plugins whose load you trust.
        timeout: limit in seconds on each guest call (0: none).
        padded: default placement of arrays (see :meth:`array`): False
            (default) flush against the guard page after them.
        strict: the older spelling: ``strict=False`` is ``padded=True``.
        engine: emulation engine (``auto``, ``qemu``, ``unicorn``; None:
            auto).
        target_options: ``cpu``/``vlen`` for the emulated backend.

    Attributes:
        manager: the :class:`hal_cpu.plugins.PluginManager` holding it.
        plugin: the registered plugin (name, description, features,
            params...).
        backend: its backend (the guest memory).
        memory: a :class:`hal_cpu.memory.GuestMemory` of that backend.
        arrays: the :class:`hal_cpu.testing.guarded.GuardedArrays` placed so far.
        timeout: the call limit, seconds.
        isolated: calls run natively, each in a child process.
        sandbox: those children are confined.

    Raises:
        hal_cpu.PluginError, elfloader.ElfError: the plugin cannot be loaded.
    """

    def __init__(self, spec: str, arch: str, backend: str = "emulated", *,
                 timeout: float = DEFAULT_TIMEOUT, padded: bool | None = None,
                 strict: bool | None = None, engine: str | None = None,
                 sandbox: bool = True, **target_options):
        from ..memory import GuestMemory
        from ..plugins import PluginManager, PluginSpec
        from .guarded import GuardedArrays, qemu_overread
        self.spec, self.timeout = str(spec), timeout
        self.sandbox = bool(sandbox)
        self.arch = arches.lookup(getattr(arch, "name", arch), runtime=True).name
        self.engine = engine
        self.target_options = dict(target_options)
        parsed = PluginSpec(self.spec)
        if parsed.kind != "embedded" and parsed.path.endswith(".so"):
            parsed = PluginSpec("embedded:" + self.spec)
        host = arches.host_arch()
        self.isolated = backend == "native" and self.arch == host
        if self.isolated:
            self._trial_load(self.arch, parsed)
            self.manager = PluginManager(self.arch, "native")
        else:
            self.manager = PluginManager(self.arch, "emulated",
                                         **self._emulation())
        self.backend = self.manager.backend
        self.memory = GuestMemory(self.backend)
        self.arrays = GuardedArrays(self.memory, padded, strict=strict)
        self._resolved: dict[str, tuple[int, int]] = {}
        try:
            cpu = self.target_options.get("cpu")
            if parsed.kind == "embedded" and cpu:
                # A bundle may hold a record per CPU profile: take this one's.
                from ..buildtools.zig import profile_image
                image = profile_image(parsed.path, self.arch, cpu)
                register = lambda: self.manager.register_embedded(  # noqa: E731
                    image, parsed.params)
            else:
                register = lambda: self.manager.register_spec(parsed)  # noqa: E731
            self.plugin = self._guest("loading the plugin", register)
            # x86 code qemu-user reads past its operands: room after arrays
            self.arrays.slack = qemu_overread(self.backend, self.modules)
        except BaseException:
            self.close()
            raise

    def _emulation(self) -> dict:
        """``engine``/``cpu``/``vlen`` for an emulated backend."""
        options = dict(self.target_options)
        if self.engine is not None:
            options["engine"] = self.engine
        return options

    def _trial_load(self, arch: str, parsed) -> None:
        """Load and unload the plugin natively in a child process first, so
        that a plugin crashing while loading fails the test, not the
        session (with the report of the load run again emulated)."""
        from ..errors import NativeCrashError
        from ..isolate import run_in_child
        from ..plugins import PluginManager

        def trial(note):
            note("while loading the plugin")
            with PluginManager(arch, "native") as manager:
                manager.register_spec(parsed)

        try:
            run_in_child(trial, name=parsed.path, what="the plugin",
                         timeout=self.timeout, sandbox=self.sandbox,
                         read=[parsed.path])
        except NativeCrashError as exc:
            def load_emulated():
                LoadedPlugin(self.spec, arch, "emulated", timeout=self.timeout,
                             engine=self.engine).close()
            raise reported(with_emulated_run(exc, arch, "the load",
                                               load_emulated)) from None
        except PortableKernelError as exc:
            raise reported(exc) from None

    @property
    def modules(self) -> list:
        """The loaded ELF modules of the manager's plugins (newest last)."""
        return [p.module for p in self.manager.plugins if hasattr(p, "module")]

    # -- arrays ----------------------------------------------------------------
    def array(self, values, *, name: str | None = None,
              align: int | None = None, padded: bool | None = None,
              strict: bool | None = None):
        """Copy ``values`` (any array-like) into guest memory between two
        guard pages (:mod:`hal_cpu.testing.guarded`) and return the
        :class:`~hal_cpu.testing.guarded.GuestArray`: pass it as a pointer field of
        a params struct; ``plugin.read(a)`` or ``np.asarray(a)`` gives its
        contents back as a numpy array.

        By default the array ends flush against the guard page after it,
        its start aligned as its dtype needs: any read or write past the
        end faults, at every vector length.

        Args:
            name: how reports name it (default: the params field it was
                passed as, else ``array N``).
            align: start it ``align``-byte aligned (a power of two up to a
                page), for code that needs more than the dtype's alignment;
                its end then lies up to ``align - 1`` bytes (of canary)
                before the guard page.
            padded: ``True``: start it 64-byte aligned as IREE aligns its
                buffers, up to 63 bytes of canary after it (a read there
                goes unseen, a write is found when the call returns);
                default ``--hal-padded-arrays``.
            strict: the older spelling: ``strict=False`` is ``padded=True``.

        Freed when the plugin is closed (or with :meth:`free`).
        """
        return self.arrays.place(np.asarray(values), name=name, align=align,
                                 padded=padded, strict=strict)

    def zeros(self, shape, dtype=np.float32, *, name: str | None = None,
              align: int | None = None, padded: bool | None = None,
              strict: bool | None = None):
        """A zero-filled guest array (see :meth:`array`)."""
        return self.arrays.place(None, dtype=dtype, shape=_shape(shape),
                                 name=name, align=align, padded=padded,
                                 strict=strict)

    def empty(self, shape, dtype=np.float32, *, name: str | None = None,
              align: int | None = None, padded: bool | None = None,
              strict: bool | None = None):
        """A guest array whose bytes are all 0xCD (:data:`hal_cpu.testing.guarded.
        POISON`), so elements the code under test never wrote stand out
        (see :meth:`array`)."""
        from .guarded import POISON
        return self.arrays.place(None, dtype=dtype, shape=_shape(shape),
                                 name=name, align=align, padded=padded,
                                 strict=strict, fill=POISON)

    def write(self, array, values) -> None:
        """Copy ``values`` (broadcast to its shape, cast to its dtype) into
        guest array ``array``."""
        self.arrays.write(array, values)

    def read(self, array, dtype=None, count=None) -> np.ndarray:
        """The contents of guest array ``array`` as a numpy array (its
        dtype and shape); or, for a plain guest address, ``count`` elements
        (or a shape) of ``dtype``."""
        from .guarded import GuestArray
        if isinstance(array, GuestArray) and dtype is None:
            return array.numpy()
        return self.memory.numpy(int(array), dtype, count)

    def free(self, array) -> None:
        """Free a guest array before the plugin is closed."""
        self.arrays.release(array)

    def params(self, layout, values: Mapping) -> bytes:
        """Bytes of a params struct: ``layout`` is a
        :class:`fatelf.cstruct.CStruct` (laid out for this architecture's
        pointer width and alignment) or a numpy structured dtype (used as
        given); guest arrays stand for their addresses."""
        return self.memory.pack(layout, values)

    # -- calls -----------------------------------------------------------------
    def resolve(self, name: str) -> tuple[int, int]:
        """``(function, context)`` of import ``name``.

        Raises:
            hal_cpu.UnresolvedImportError: the plugin does not provide it.
        """
        if name not in self._resolved:
            fns, ctxs = self._guest(f"resolving {name}",
                                    lambda: self.manager.resolve([name]))
            self._resolved[name] = (fns[0], ctxs[0])
        return self._resolved[name]

    def call(self, name: str, layout, values: Mapping, *,
             timeout: float | None = None) -> int:
        """Call import ``name`` as an executable does, ``fn(params,
        context, NULL)``, with a params struct built from ``values`` (see
        :meth:`params`) and placed in guest memory like an array; returns
        the import's int result (0: success).

        Args:
            timeout: seconds for this call (default: the plugin's).

        Raises:
            hal_cpu.UnresolvedImportError: the plugin does not provide it.
            hal_cpu.BindingOverrunError: the import read or wrote past the
                end of an array (``what`` the array, ``offset``,
                ``import_name``); its message is the fault report.
            hal_cpu.BindingUnderrunError: the same before an array's start.
            hal_cpu.CallTimeoutError: the call ran past its time limit.
            elfloader.EmulationError: any other fault (the report).
            hal_cpu.NativeCrashError: natively, the child process died by a
                signal (the message names the import and its symbol, then
                gives the report of the call run again emulated).
        """
        from elfloader import as_int32

        from .guarded import GuestArray
        fn, ctx = self.resolve(name)
        from ..faults import field_names
        names = field_names(values, GuestArray)
        # (flush against its guard page too, its start aligned for any
        # field: C struct sizes are multiples of their alignment)
        params = self.arrays.place(
            np.frombuffer(self.params(layout, values), np.uint8),
            name=f"params of {name}", align=PARAMS_ALIGNMENT)
        names[params] = params.name
        seconds = self.timeout if timeout is None else timeout
        try:
            if self.isolated:
                result = self._call_in_child(
                    name, fn, params, ctx, seconds,
                    lambda: self._rerun_emulated(name, layout, values,
                                                 seconds, params))
            else:
                result = self._guest(
                    name, lambda: self.backend.call(fn, params.address, ctx, 0),
                    import_name=name, names=names, seconds=seconds)
            self._check_canaries(name, names)
            return as_int32(result)
        finally:
            self.arrays.release(params)

    def _guest(self, what: str, fn, *, import_name: str | None = None,
               names: dict | None = None, seconds: float | None = None):
        """Run ``fn`` (guest calls) under the time limit, interruptible by
        Ctrl-C; an emulation error becomes its report."""
        from elfloader import EmulationError

        from ..faults import import_fault
        from ..interrupt import run_interruptible
        seconds = self.timeout if seconds is None else seconds
        try:
            with self.backend.time_limit(seconds):
                return run_interruptible(
                    fn, lambda: self.backend.stop_workers(1))
        except EmulationError as exc:
            raise reported(import_fault(
                exc, self.backend, self.modules, import_name or what,
                self.arrays, names, seconds,
                overrun=lambda fault, report: self._overrun(fault, report,
                                                           names))) from None
        except PortableKernelError as exc:
            raise reported(exc) from None

    def _overrun(self, fault, report, names: dict | None) -> str | None:
        """The report's ``overrun`` row for ``fault`` (report ``report``):
        in elements of the test array its data address lies outside of,
        how far the access reached, e.g. ``src (float32[101], 404 bytes):
        the access reached element 101, 1 float past the end`` (with the
        access size where the engine knows it: unicorn); None when the
        address lies by no array or the access stayed inside it."""
        from .guarded import overrun_elements, qemu_overread_of
        address = fault.data_address
        near = self.arrays.near(address) if address is not None else None
        if near is None:
            return None
        array, offset = near
        size = fault.size or 0
        # past the end: the last byte the access touched; before the start:
        # the first
        reach = offset + size - 1 if size and offset >= 0 else offset
        extra = (qemu_overread_of(report.instruction)
                 if not size and (report.engine or "").startswith("qemu")
                 else 0)
        if extra and offset >= array.nbytes:
            # qemu-user loaded ``extra`` bytes past the operand: the operand
            # itself reached at least this far
            reach = offset - extra
        if 0 <= reach < array.nbytes:
            return None
        element = reach // max(1, array.dtype.itemsize)
        access = f"the {size}-byte access" if size else "the access"
        label = (names or {}).get(array, array.name)
        text = (f"{label} ({array.dtype}{list(array.shape)}, "
                f"{array.nbytes} bytes): {access} reached element {element}, "
                f"{overrun_elements(array, reach, reach)}")
        if extra and offset >= array.nbytes:
            text += (f" (its operand: qemu-user loads {extra} bytes past it, "
                     "up to the data address)")
        return text

    def _call_in_child(self, name: str, fn: int, params, ctx: int,
                       seconds: float, rerun=None) -> int:
        from elfloader import EmulationError
        from elfloader.diagnose import Symbolizer

        from ..faults import timed_out
        from ..isolate import run_in_child
        symbol = next((s.symbolize(fn) for s in
                       (Symbolizer(m.image, m.base) for m in self.modules)
                       if s.contains(fn)), None)
        where = f"in import {name}" + (f" ({symbol})" if symbol else "")
        arrays = self.arrays

        def child(note):
            # The crash is the parent's to report: no Python stack dump.
            faulthandler.disable()
            note(where)
            result = self.backend.call(fn, params.address, ctx, 0)
            return result, arrays.snapshot()

        from ..errors import NativeCrashError
        label = self.modules[-1].name if self.modules else self.spec
        try:
            answer = run_in_child(child, name=label, what="the plugin",
                                  timeout=seconds, sandbox=self.sandbox)
            result, snapshot = self._checked_answer(answer, label)
        except NativeCrashError as exc:
            if rerun is not None:
                exc = with_emulated_run(exc, self.arch, "the call", rerun)
            raise reported(exc) from None
        except PortableKernelError as exc:
            if (isinstance(exc, EmulationError) and timed_out(exc)
                    and where not in str(exc)):
                exc.args = (f"{exc.args[0]} {where}",)
            raise reported(exc) from None
        arrays.restore(snapshot)
        return result

    def _checked_answer(self, answer, label: str) -> tuple[int, list]:
        """A call's child's ``(result, snapshot)``, checked: an integer
        result, and exactly the ranges :meth:`GuardedArrays.snapshot` gives
        for this plugin's arrays (a confined child is not trusted to say
        where its bytes go).

        Raises:
            HalCpuError: another shape (``field`` ``child``).
        """
        from ..errors import HalCpuError
        want = [(a.body[0], a.body[1] - a.body[0]) for a in self.arrays.arrays]
        if (isinstance(answer, tuple) and len(answer) == 2
                and isinstance(answer[0], int) and isinstance(answer[1], list)
                and len(answer[1]) == len(want)
                and all(isinstance(got, tuple) and len(got) == 2
                        and got[0] == address and isinstance(got[1], bytes)
                        and len(got[1]) == size
                        for got, (address, size) in zip(answer[1], want))):
            return answer
        raise HalCpuError("the child process running the call sent an answer "
                          "of another shape", name=label, field="child",
                          value=type(answer).__name__)

    def _rerun_emulated(self, name: str, layout, values: Mapping,
                        seconds: float, params) -> None:
        """Call import ``name`` once more, emulated, on copies of this
        plugin's arrays as they were before the call (the crashed child's
        writes never reached them); a failure raises its report."""
        from .guarded import GuestArray
        twin = LoadedPlugin(self.spec, self.arch, "emulated",
                            timeout=self.timeout, engine=self.engine)
        try:
            copies = {}
            for a in self.arrays.arrays:
                if a is params:
                    continue
                copy = twin.arrays.place(a.numpy(), align=a.align)
                copy.name, copy.index = a.name, a.index
                copy.explicit_name = a.explicit_name
                copies[a] = copy
            twin.call(name, layout,
                      {k: copies.get(v, v) if isinstance(v, GuestArray) else v
                       for k, v in values.items()}, timeout=seconds)
        finally:
            twin.close()

    def _check_canaries(self, name: str, names: dict) -> None:
        """Raise for a write into the canary bytes around an array."""
        from elfloader.errors import OVERRUN, Fault

        from ..faults import bounds_error
        from .guarded import overrun_elements
        changed = self.arrays.changed()
        if not changed:
            return
        array, first, last = changed[0]
        label = names.get(array, array.name)
        file = self.modules[-1].name if self.modules else self.spec
        size = array.dtype.itemsize
        element = first // size
        if first < 0:
            where = f"{-first} bytes before the start, element {element}"
        else:
            where = (f"{first - array.nbytes + 1} past the end, element "
                     f"{element} of {array.size}")
        span = last - first + 1
        where += f"; {overrun_elements(array, first, last)}"
        message = (f"{file}: {self.backend.arch.name}: import {name} wrote "
                   f"outside {label} ({array.dtype}{list(array.shape)}, "
                   f"{array.nbytes} bytes at {array.address:#x}): "
                   f"{span} byte{'s' if span != 1 else ''} changed from "
                   f"offset {first} ({where}); seen after the call")
        raise reported(bounds_error(
            message, array, first, name, file, names,
            fault=Fault("overrun", OVERRUN, access="write",
                        address=array.address + first)))

    def close(self) -> None:
        """Free every array and unload the plugin (its backend too)."""
        arrays = getattr(self, "arrays", None)
        if arrays is not None:
            arrays.close()
        manager = getattr(self, "manager", None)
        if manager is not None:
            manager.close()


def _shape(shape) -> tuple[int, ...]:
    return (int(shape),) if np.ndim(shape) == 0 else tuple(int(n) for n in shape)


#: Alignment of the params struct a call places (any C field's).
PARAMS_ALIGNMENT = 16


def with_emulated_run(exc, arch: str, what: str, rerun):
    """``exc`` (a native crash) with, after its message, how ``what`` (``the
    call``, ``the dispatch``) ended when ``rerun()`` ran it again emulated:
    its fault report (symbol, source line, instruction), as ``hal-cpu run``
    shows after a native crash. The emulated error is kept as
    ``exc.emulated`` (None when the emulated run did not fail)."""
    header = f"ran {what} again emulated ({arch}) to find the fault:"
    exc.emulated = None
    try:
        rerun()
    except PortableKernelError as emu:
        exc.emulated = emu
        text = f"{type(emu).__name__}: {emu}"
    except Exception as emu:  # noqa: BLE001 - the native report stands
        text = (f"the emulated run could not be made: "
                f"{type(emu).__name__}: {emu}")
    else:
        text = ("the emulated run finished without a fault (the crash "
                "depends on something the emulation does not reproduce, "
                "such as the host's CPU features or timing)")
    exc.args = (f"{exc.args[0] if exc.args else exc}\n{header}\n{text}",)
    return exc


#: More workers than a dispatch runs: stop them all.
MOST_WORKERS = 256


def guard_dispatch(exe, seconds: float, isolated: bool,
                    emulated=None, sandbox: bool = True) -> None:
    """Make ``exe.dispatch`` honour the time limit, Ctrl-C and, natively,
    run in a child process, confined unless ``sandbox`` is False
    (:func:`hal_cpu.isolate.confinement`; unconfined, the kernel has the
    caller's rights); its failures are shown as their reports (a native
    crash with the report of the dispatch run again on the executable
    ``emulated()`` opens)."""
    from ..errors import NativeCrashError
    from ..interrupt import run_interruptible
    from ..isolate import run_in_child, shared_array
    dispatch = exe.dispatch

    def guarded(export, workgroup_count=(1, 1, 1), bindings=(), constants=(),
                **kw):
        kw.setdefault("timeout", seconds or None)
        try:
            if isolated:
                copies = [shared_array(np.ascontiguousarray(b)) for b in bindings]

                def child(note):
                    note(f"in export {export}")
                    dispatch(export, workgroup_count, copies, constants, **kw)

                try:
                    run_in_child(child, name=exe.path, what="the kernel",
                                 timeout=seconds or None, sandbox=sandbox,
                                 read=[exe.path] if isinstance(exe.path, str)
                                 else [])
                except NativeCrashError as exc:
                    if emulated is None:
                        raise

                    def rerun():
                        # the bindings as they were before the dispatch
                        again = [np.array(b, copy=True) for b in bindings]
                        with emulated() as twin:
                            twin.dispatch(export, workgroup_count, again,
                                          constants, **kw)

                    raise with_emulated_run(exc, exe.arch.name,
                                             "the dispatch", rerun) from None
                for b, c in zip(bindings, copies):
                    if isinstance(b, np.ndarray) and b.flags.writeable:
                        b[...] = c
                return None
            return run_interruptible(
                lambda: dispatch(export, workgroup_count, bindings, constants,
                                 **kw),
                lambda: exe.backend.stop_workers(MOST_WORKERS))
        except PortableKernelError as exc:
            raise reported(exc) from None

    exe.dispatch = guarded
