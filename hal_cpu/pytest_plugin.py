"""A pytest plugin for plugin and kernel authors: test on six architectures
and turn every plugin bug into a failing test with an explanation.

Installed with the package (entry point ``pytest11``). Options:

* ``--hal-arch=all|host|x86_64,riscv64,...`` (default ``all``): the
  architectures tests are parametrized over (aliases accepted: ``arm64``,
  ``rv32``...).
* ``--hal-backend=emulated|native`` (default ``emulated``): emulated runs
  every architecture, the host's included, on the emulator, so a bug is a
  report and never a signal; ``native`` runs the host architecture's calls
  natively, each in a child process (a crash fails that one test with the
  signal, the import and its symbol), the others emulated.
* ``--hal-timeout=SECONDS`` (default 60; 0: none): limit on every guest
  call the fixtures make; the ``hal_timeout(SECONDS)`` marker sets it per
  test. A call past it fails its test with a report of where it was.
* ``--hal-strict-bounds``: place every array flush against the guard page
  after it (natural alignment instead of 64 bytes), so even a one-element
  read past the end faults (see :mod:`hal_cpu.guarded`).
* ``--hal-cpu=PROFILES``: parametrize over CPU profiles instead of bare
  architectures, e.g. ``--hal-cpu='rv64gcv:vlen=128,256,512'``, ``sve:vl=
  128,512``, ``x86-64-v3`` (repeatable, or several separated by ``;``);
  ``ARCH/PROFILE`` names the architecture when a profile name is not unique.

Fixtures (``pytest --fixtures`` lists them): ``hal_arch``, ``hal_cpu``,
``hal_vlen``, ``hal_backend``, ``hal_timeout``, ``hal_plugin``,
``hal_executable``.

A failure inside guest code called through the fixtures fails the test
with the fault report as its message (no traceback through the backend):
the plugin file, the import, the symbol and source line of the pc, the
instruction, and which array (and how far outside it) a data address lies.
The fixtures work under pytest-xdist (``pytest -n auto``).
"""

from __future__ import annotations

import faulthandler
import os
import re
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pytest

from fatelf import arches
from fatelf.errors import PortableKernelError

#: Default ``--hal-timeout``, seconds.
DEFAULT_TIMEOUT = 60.0

BACKENDS = ("emulated", "native")


def pytest_addoption(parser):
    group = parser.getgroup("hal-cpu", "IREE CPU kernels on several architectures")
    group.addoption("--hal-arch", default="all", metavar="ARCHES",
                    help="architectures for the hal_arch fixture: all, host, or "
                         "a comma-separated list (aliases accepted)")
    group.addoption("--hal-backend", default="emulated", choices=BACKENDS,
                    help="emulated (default): every architecture on the "
                         "emulator; native: the host's calls natively, each "
                         "in a child process")
    group.addoption("--hal-timeout", default=DEFAULT_TIMEOUT, type=float,
                    metavar="SECONDS",
                    help="limit on each guest call of the hal_* fixtures "
                         f"(default {DEFAULT_TIMEOUT:g}; 0: none)")
    group.addoption("--hal-strict-bounds", action="store_true",
                    help="place test arrays flush against their guard page, "
                         "so a one-element read past the end faults")
    group.addoption("--hal-cpu", action="append", default=[],
                    metavar="PROFILES",
                    help="parametrize over CPU profiles, e.g. "
                         "'rv64gcv:vlen=128,256,512', 'sve:vl=128,512', "
                         "'x86-64-v3' (repeatable; ';' separates several)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "hal_timeout(seconds): limit on each guest call the hal_* "
        "fixtures make in this test (overrides --hal-timeout; 0: none)")


# --- what a test runs on -------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One parametrization: an architecture, and optionally a CPU profile
    and vector length (bits)."""

    arch: str
    cpu: str | None = None
    vlen: int | None = None

    @property
    def id(self) -> str:
        parts = [self.arch] + ([self.cpu] if self.cpu else [])
        if self.vlen:
            parts.append(f"vlen{self.vlen}")
        return "-".join(parts)

    def options(self) -> dict:
        """Keyword arguments for the backend: ``cpu``/``vlen`` when set."""
        return {k: v for k, v in (("cpu", self.cpu), ("vlen", self.vlen)) if v}


def selected_arches(text: str) -> list[str]:
    """Architecture names for a ``--hal-arch`` value.

    Raises:
        pytest.UsageError: an unknown name.
    """
    names: list[str] = []
    try:
        for token in (t.strip() for t in text.split(",") if t.strip()):
            if token == "all":
                picked = list(arches.RUNTIME_ARCHES)
            elif token == "host":
                picked = [arches.host_arch()]
            else:
                picked = [arches.lookup(token, runtime=True).name]
            names += [n for n in picked if n not in names]
    except arches.FatElfSelectError as exc:
        raise pytest.UsageError(f"--hal-arch: {exc.message}") from None
    return names


_PROFILE = re.compile(r"^(?:(?P<arch>[^/:]+)/)?(?P<name>[^:]+)"
                      r"(?::(?:vlen|vl)=(?P<lengths>\d+(?:,\d+)*))?$")


def selected_profiles(values: list[str], allowed: list[str]) -> list[Target]:
    """Targets for ``--hal-cpu`` values: each ``[ARCH/]PROFILE[:vlen=N,M]``
    (``vl=`` is a synonym) gives one target per vector length, for the
    architecture whose table has that profile
    (``fatelf.arches.profile(arch, name)``), among ``allowed``.

    Raises:
        pytest.UsageError: malformed value or unknown profile.
    """
    targets: list[Target] = []
    for item in (t.strip() for v in values for t in v.split(";") if t.strip()):
        m = _PROFILE.match(item)
        if not m:
            raise pytest.UsageError(
                f"--hal-cpu: {item!r} is not [ARCH/]PROFILE[:vlen=N,M,...]")
        if m["arch"]:
            try:
                candidates = [arches.lookup(m["arch"], runtime=True).name]
            except arches.FatElfSelectError as exc:
                raise pytest.UsageError(f"--hal-cpu: {exc.message}") from None
        else:
            candidates = list(allowed)
        found = []
        for arch in candidates:
            try:
                arches.profile(arch, m["name"])
            except arches.FatElfSelectError:    # not a profile of this arch
                continue
            found.append(arch)
        if not found:
            raise pytest.UsageError(
                f"--hal-cpu: no architecture in {', '.join(candidates)} has a "
                f"CPU profile {m['name']!r}")
        lengths = ([int(n) for n in m["lengths"].split(",")] if m["lengths"]
                   else [None])
        for arch in found:
            for vlen in lengths:
                t = Target(arch, m["name"], vlen)
                if t not in targets:
                    targets.append(t)
    return targets


def _targets(config) -> list[Target]:
    allowed = selected_arches(config.getoption("--hal-arch"))
    profiles = config.getoption("--hal-cpu")
    if profiles:
        return selected_profiles(profiles, allowed)
    return [Target(a) for a in allowed]


_TARGET_FIXTURES = ("hal_arch", "hal_cpu", "hal_vlen", "hal_plugin",
                    "hal_executable")


def pytest_generate_tests(metafunc):
    if any(n in metafunc.fixturenames for n in _TARGET_FIXTURES):
        targets = _targets(metafunc.config)
        metafunc.parametrize("hal_target", targets, ids=[t.id for t in targets],
                             scope="function")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A guest failure raised through the fixtures is shown as its report
    (the error type and message), without a traceback through the
    backend."""
    outcome = yield
    rep = outcome.get_result()
    exc = call.excinfo.value if call.excinfo is not None else None
    if rep.failed and getattr(exc, "hal_report", False):
        rep.longrepr = f"{type(exc).__name__}: {exc}"


def _reported(exc: BaseException) -> BaseException:
    """Mark ``exc`` to be shown as its report by the hook above."""
    try:
        exc.hal_report = True
    except AttributeError:
        pass
    return exc


# --- one plugin under test -----------------------------------------------------

class LoadedPlugin:
    """A plugin loaded into its own backend for one architecture.

    Args:
        spec: a ``.sos`` bundle or a per-architecture ``.so``, with
            optional ``?key=value&...`` load parameters.
        arch: architecture name.
        backend: ``emulated`` or ``native`` (calls in a child process).
        timeout: limit in seconds on each guest call (0: none).
        strict: default placement of arrays (see :meth:`array`).
        target_options: ``cpu``/``vlen`` for the backend.

    Attributes:
        manager: the :class:`hal_cpu.plugins.PluginManager` holding it.
        plugin: the registered plugin (name, description, features,
            params...).
        backend: its backend (the guest memory).
        memory: a :class:`hal_cpu.memory.GuestMemory` of that backend.
        arrays: the :class:`hal_cpu.guarded.GuardedArrays` placed so far.
        timeout: the call limit, seconds.

    Raises:
        hal_cpu.PluginError, elfloader.ElfError: the plugin cannot be loaded.
    """

    def __init__(self, spec: str, arch: str, backend: str = "emulated", *,
                 timeout: float = DEFAULT_TIMEOUT, strict: bool = False,
                 **target_options):
        from .guarded import GuardedArrays
        from .memory import GuestMemory
        from .plugins import PluginManager, PluginSpec
        self.spec, self.timeout = str(spec), timeout
        parsed = PluginSpec(self.spec)
        if parsed.kind != "embedded" and parsed.path.endswith(".so"):
            parsed = PluginSpec("embedded:" + self.spec)
        host = arches.host_arch()
        self.isolated = backend == "native" and arch == host
        kind = "native" if self.isolated else "emulated"
        if self.isolated:
            self._trial_load(arch, parsed)
        self.manager = PluginManager(arch, kind, **target_options)
        self.backend = self.manager.backend
        self.memory = GuestMemory(self.backend)
        self.arrays = GuardedArrays(self.memory, strict)
        self._resolved: dict[str, tuple[int, int]] = {}
        try:
            self.plugin = self._guest(
                "loading the plugin", lambda: self.manager.register_spec(parsed))
        except BaseException:
            self.close()
            raise

    def _trial_load(self, arch: str, parsed) -> None:
        """Load and unload the plugin natively in a child process first, so
        that a plugin crashing while loading fails the test, not the
        session."""
        from .isolate import run_in_child
        from .plugins import PluginManager

        def trial(note):
            note("while loading the plugin")
            with PluginManager(arch, "native") as manager:
                manager.register_spec(parsed)

        try:
            run_in_child(trial, name=parsed.path, what="the plugin",
                         timeout=self.timeout)
        except PortableKernelError as exc:
            raise _reported(exc) from None

    @property
    def modules(self) -> list:
        """The loaded ELF modules of the manager's plugins (newest last)."""
        return [p.module for p in self.manager.plugins if hasattr(p, "module")]

    # -- arrays ----------------------------------------------------------------
    def array(self, values, *, name: str | None = None,
              strict: bool | None = None):
        """Copy ``values`` (any array-like) into guest memory between two
        guard pages (:mod:`hal_cpu.guarded`) and return the
        :class:`~hal_cpu.guarded.GuestArray`: pass it as a pointer field of
        a params struct; ``plugin.read(a)`` or ``np.asarray(a)`` gives its
        contents back as a numpy array.

        Args:
            name: how reports name it (default: the params field it was
                passed as, else ``array N``).
            strict: place it flush against the guard page after it (a
                one-element read past the end faults); default
                ``--hal-strict-bounds``. Otherwise it starts 64-byte
                aligned and up to 63 bytes of canary follow it.

        Freed when the plugin is closed (or with :meth:`free`).
        """
        return self.arrays.place(np.asarray(values), name=name, strict=strict)

    def zeros(self, shape, dtype=np.float32, *, name: str | None = None,
              strict: bool | None = None):
        """A zero-filled guest array (see :meth:`array`)."""
        return self.arrays.place(None, dtype=dtype, shape=_shape(shape),
                                 name=name, strict=strict)

    def empty(self, shape, dtype=np.float32, *, name: str | None = None,
              strict: bool | None = None):
        """A guest array whose bytes are all 0xCD (:data:`hal_cpu.guarded.
        POISON`), so elements the code under test never wrote stand out
        (see :meth:`array`)."""
        from .guarded import POISON
        return self.arrays.place(None, dtype=dtype, shape=_shape(shape),
                                 name=name, strict=strict, fill=POISON)

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
                signal (the message names the import and its symbol).
        """
        from elfloader import as_int32
        from .guarded import GuestArray
        fn, ctx = self.resolve(name)
        names = {v: k for k, v in values.items()
                 if isinstance(v, GuestArray) and not v.explicit_name}
        params = self.arrays.place(
            np.frombuffer(self.params(layout, values), np.uint8),
            name=f"params of {name}")
        names[params] = params.name
        seconds = self.timeout if timeout is None else timeout
        try:
            if self.isolated:
                result = self._call_in_child(name, fn, params, ctx, seconds)
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
        from .faults import import_fault
        from .interrupt import run_interruptible
        from .library import call_limit
        seconds = self.timeout if seconds is None else seconds
        try:
            with call_limit(self.backend, seconds):
                return run_interruptible(
                    fn, lambda: self.backend.stop_workers(1))
        except EmulationError as exc:
            err = import_fault(exc, self.backend, self.modules,
                               import_name or what, self.arrays, names,
                               seconds)
            raise _reported(err) from None
        except PortableKernelError as exc:
            raise _reported(exc) from None

    def _call_in_child(self, name: str, fn: int, params, ctx: int,
                       seconds: float) -> int:
        from .isolate import run_in_child
        from elfloader.diagnose import Symbolizer
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

        try:
            result, snapshot = run_in_child(
                child, name=self.modules[-1].name if self.modules else self.spec,
                what="the plugin", timeout=seconds)
        except PortableKernelError as exc:
            if getattr(exc, "fault", None) == "timeout":
                exc.args = (f"{exc.args[0]} {where}",)
            raise _reported(exc) from None
        arrays.restore(snapshot)
        return result

    def _check_canaries(self, name: str, names: dict) -> None:
        """Raise for a write into the canary bytes around an array."""
        from .faults import bounds_error
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
        message = (f"{file}: {self.backend.arch.name}: import {name} wrote "
                   f"outside {label} ({array.dtype}{list(array.shape)}, "
                   f"{array.nbytes} bytes at {array.address:#x}): "
                   f"{span} byte{'s' if span != 1 else ''} changed from "
                   f"offset {first} ({where}); seen after the call")
        err = bounds_error(message, array, first, name, file, names)
        Exception.__init__(err, message)
        err.fault, err.fault_address = "overrun", array.address + first
        raise _reported(err)

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


# --- fixtures ----------------------------------------------------------------------

@pytest.fixture
def hal_target(request) -> Target:
    """The :class:`Target` (architecture, CPU profile, vector length) of
    the current test; parametrized from ``--hal-arch`` / ``--hal-cpu``."""
    return request.param


@pytest.fixture
def hal_arch(hal_target) -> str:
    """Name of the architecture of the current test (``x86_64``,
    ``aarch64``, ``riscv64``, ``x86_32``, ``arm32``, ``riscv32``): a test
    that takes it (or ``hal_plugin`` / ``hal_executable``) runs once per
    architecture of ``--hal-arch`` (default all six)."""
    return hal_target.arch


@pytest.fixture
def hal_cpu(hal_target) -> str | None:
    """The CPU profile of the current test (``--hal-cpu``), or None for the
    architecture's default model."""
    return hal_target.cpu


@pytest.fixture
def hal_vlen(hal_target) -> int | None:
    """The vector length in bits of the current test (``--hal-cpu
    PROFILE:vlen=N``), or None."""
    return hal_target.vlen


@pytest.fixture
def hal_backend(request) -> str:
    """The backend kind chosen with ``--hal-backend``: ``emulated`` or
    ``native`` (host architecture natively, each call in a child process)."""
    return request.config.getoption("--hal-backend")


@pytest.fixture
def hal_timeout(request) -> float:
    """Seconds each guest call of this test may run (the ``hal_timeout``
    marker, else ``--hal-timeout``; 0: no limit)."""
    marker = request.node.get_closest_marker("hal_timeout")
    if marker is not None:
        if not marker.args:
            raise pytest.UsageError("hal_timeout needs the seconds: "
                                    "@pytest.mark.hal_timeout(5)")
        return float(marker.args[0])
    return float(request.config.getoption("--hal-timeout"))


@pytest.fixture
def hal_plugin(request, hal_target, hal_backend, hal_timeout):
    """``hal_plugin(spec, strict=None)`` -> :class:`LoadedPlugin` for the
    current architecture: ``spec`` is a ``.sos`` bundle (its record for the
    architecture) or a ``.so``, with optional ``?key=value`` load
    parameters. Its ``array``/``zeros``/``empty`` place numpy arrays
    between guard pages, ``call(name, layout, values)`` calls an import
    with a params struct, ``read`` gives arrays back. Everything is freed
    at the end of the test."""
    loaded: list[LoadedPlugin] = []

    def load(spec, strict: bool | None = None) -> LoadedPlugin:
        plugin = LoadedPlugin(
            os.fspath(spec), hal_target.arch, hal_backend,
            timeout=hal_timeout, strict=strict if strict is not None else
            request.config.getoption("--hal-strict-bounds"),
            **hal_target.options())
        loaded.append(plugin)
        return plugin

    yield load
    for plugin in loaded:
        plugin.close()


@pytest.fixture
def hal_executable(hal_target, hal_backend, hal_timeout):
    """``hal_executable(path, plugins=None)`` -> :class:`hal_cpu.Executable`
    for the current architecture (a FatELF picks its record), with imports
    resolved through ``plugins`` (a :class:`LoadedPlugin` or a plugin
    manager). Its ``dispatch`` runs under the time limit and Ctrl-C stops
    it; with ``--hal-backend=native`` each dispatch runs in a child
    process. Closed at the end of the test."""
    from .library import Executable
    opened: list = []

    def load(path, plugins=None):
        manager = getattr(plugins, "manager", plugins)
        isolated = (hal_backend == "native" and manager is None
                    and hal_target.arch == arches.host_arch())
        kind = "native" if isolated else "emulated"
        try:
            # (with plugins, the executable runs on their machine)
            exe = Executable(os.fspath(path), arch=hal_target.arch,
                             backend=kind, plugins=manager, timeout=hal_timeout,
                             **({} if manager else hal_target.options()))
        except PortableKernelError as exc:
            raise _reported(exc) from None
        opened.append(exe)
        _guard_dispatch(exe, hal_timeout, isolated)
        return exe

    yield load
    for exe in opened:
        exe.close()


#: More workers than a dispatch runs: stop them all.
_MOST_WORKERS = 256


def _guard_dispatch(exe, seconds: float, isolated: bool) -> None:
    """Make ``exe.dispatch`` honour the time limit, Ctrl-C and, natively,
    run in a child process; its failures are shown as their reports."""
    from .interrupt import run_interruptible
    from .isolate import run_in_child, shared_array
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

                run_in_child(child, name=exe.path, what="the kernel",
                             timeout=seconds or None)
                for b, c in zip(bindings, copies):
                    if isinstance(b, np.ndarray) and b.flags.writeable:
                        b[...] = c
                return None
            return run_interruptible(
                lambda: dispatch(export, workgroup_count, bindings, constants,
                                 **kw),
                lambda: exe.backend.stop_workers(_MOST_WORKERS))
        except PortableKernelError as exc:
            raise _reported(exc) from None

    exe.dispatch = guarded
