"""A pytest plugin for plugin and kernel authors: test on six architectures
and turn every plugin bug into a failing test with an explanation.

Installed with the package (entry point ``pytest11``). Options (checked
when pytest starts: a bad one is one usage error before collection):

* ``--hal-arch=all|host|x86_64,riscv64,...`` (default ``all``): the
  architectures tests are parametrized over (aliases accepted: ``arm64``,
  ``rv32``...).
* ``--hal-backend=emulated|native`` (default ``emulated``): emulated runs
  every architecture, the host's included, on the emulator, so a bug is a
  report and never a signal; ``native`` runs the host architecture's calls
  natively, each in a child process (a crash fails that one test with the
  signal, the import and its symbol, and the report of the call run again
  emulated), the others emulated.
* ``--hal-engine=auto|qemu|unicorn`` (default ``auto``: ``$PKR_ENGINE``,
  else qemu-user where it is installed and sandboxed, else unicorn): the
  emulation engine.
* ``--hal-timeout=SECONDS`` (default 60; 0: none): limit on every guest
  call the fixtures make; the ``hal_timeout(SECONDS)`` marker sets it per
  test. A call past it fails its test with a report of where it was.
* ``--hal-padded-arrays``: place arrays as IREE aligns its buffers (start
  64-byte aligned, up to 63 bytes of canary after the end) instead of
  flush against the guard page after them (the default, where even a
  one-element read past the end faults; see :mod:`hal_cpu.guarded`).
  ``--hal-strict-bounds`` names the default.
* ``--hal-cpu=PROFILES``: run the tests of a profile's architecture once
  per CPU profile and vector length, e.g. ``--hal-cpu='rv64gcv:vlen=128,
  256,512'``, ``sve:vl=128,512``, ``x86-64-v3`` (repeatable, or several
  separated by ``;``); the other architectures run at their defaults.
  ``ARCH/PROFILE`` names the architecture when a profile name is not
  unique.

Fixtures (``pytest --fixtures`` lists them): ``hal_arch``, ``hal_cpu``,
``hal_vlen``, ``hal_backend``, ``hal_engine``, ``hal_timeout``,
``hal_plugin``, ``hal_executable``.

A failure inside guest code called through the fixtures fails the test
with the fault report as its message (no traceback through the backend):
the plugin file, the import, the symbol and source line of the pc, the
instruction, and which array a data address lies outside of, how far in
bytes and in the array's elements.
The fixtures work under pytest-xdist (``pytest -n auto``).
"""

from __future__ import annotations

import faulthandler
import math
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
ENGINES = ("auto", "qemu", "unicorn")


def pytest_addoption(parser):
    group = parser.getgroup("hal-cpu", "IREE CPU kernels on several architectures")
    group.addoption("--hal-arch", default="all", metavar="ARCHES",
                    help="architectures for the hal_arch fixture: all, host, or "
                         "a comma-separated list (aliases accepted)")
    group.addoption("--hal-backend", default="emulated", choices=BACKENDS,
                    help="emulated (default): every architecture on the "
                         "emulator; native: the host's calls natively, each "
                         "in a child process")
    group.addoption("--hal-engine", default="auto", choices=ENGINES,
                    help="emulation engine: qemu (qemu-user; AVX2/FMA, SVE, "
                         "RVV), unicorn (in process; no vector extensions "
                         "beyond SSE/NEON), or auto ($PKR_ENGINE, else qemu "
                         "where installed; default)")
    group.addoption("--hal-timeout", default=DEFAULT_TIMEOUT, type=float,
                    metavar="SECONDS",
                    help="limit on each guest call of the hal_* fixtures "
                         f"(default {DEFAULT_TIMEOUT:g}; 0: none)")
    group.addoption("--hal-padded-arrays", action="store_true",
                    help="start test arrays 64-byte aligned, as IREE's "
                         "buffers, with up to 63 bytes of canary after them "
                         "(a read there goes unseen); default: flush against "
                         "the guard page after them")
    group.addoption("--hal-strict-bounds", action="store_true",
                    help="arrays flush against their guard page (the "
                         "default; kept for older command lines)")
    group.addoption("--hal-cpu", action="append", default=[],
                    metavar="PROFILES",
                    help="run the tests of a profile's architecture once per "
                         "CPU profile and vector length, e.g. "
                         "'rv64gcv:vlen=128,256,512', 'sve:vl=128,512', "
                         "'x86-64-v3' (repeatable; ';' separates several); "
                         "other architectures run at their defaults")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "hal_timeout(seconds): limit on each guest call the hal_* "
        "fixtures make in this test (overrides --hal-timeout; 0: none)")
    # Every option is checked here, before collection: a mistake is one
    # usage error, not an error in every test.
    config.stash[_SETTINGS] = settings(config)


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


@dataclass(frozen=True)
class Settings:
    """The checked ``--hal-*`` options of a session.

    Attributes:
        targets: what each test taking the fixtures runs on, in order.
        backend: ``emulated`` or ``native``.
        engine: ``auto``, ``qemu`` or ``unicorn``.
        timeout: seconds per guest call (0: none).
        padded: arrays start 64-byte aligned with canary after them
            (``--hal-padded-arrays``) instead of flush against the guard
            page.
    """

    targets: tuple[Target, ...]
    backend: str = "emulated"
    engine: str = "auto"
    timeout: float = DEFAULT_TIMEOUT
    padded: bool = False


_SETTINGS = pytest.StashKey[Settings]()


def settings(config) -> Settings:
    """The checked options of ``config`` (computed once, at configure).

    Raises:
        pytest.UsageError: an option pytest could parse but this plugin
            cannot honour (unknown architecture or profile, a vector length
            the profile cannot take, a profile of the host's architecture
            with ``--hal-backend=native``, an engine that cannot run a
            profile or is not installed, a negative time limit...).
    """
    got = config.stash.get(_SETTINGS, None)
    if got is not None:
        return got
    backend = config.getoption("--hal-backend")
    engine = config.getoption("--hal-engine")
    timeout = config.getoption("--hal-timeout")
    if not (math.isfinite(timeout) and timeout >= 0):
        raise pytest.UsageError(f"--hal-timeout={timeout:g}: a time limit is "
                                "a number of seconds, 0 or more (0: none)")
    padded = config.getoption("--hal-padded-arrays")
    if padded and config.getoption("--hal-strict-bounds"):
        raise pytest.UsageError("--hal-padded-arrays and --hal-strict-bounds "
                                "contradict each other: pick one")
    arch_text = config.getoption("--hal-arch")
    allowed = selected_arches(arch_text)
    profiles = config.getoption("--hal-cpu")
    targets = (targets_with_profiles(profiles, allowed, arch_text)
               if profiles else [Target(a) for a in allowed])
    host = arches.host_arch()
    if backend == "native":
        for t in targets:
            if t.cpu and t.arch == host:
                raise pytest.UsageError(
                    f"--hal-cpu={t.cpu}: with --hal-backend=native, {host} "
                    "code runs on this machine's own CPU, which a CPU profile "
                    "cannot change; drop --hal-cpu or use "
                    "--hal-backend=emulated")
    _check_engine(engine, [t for t in targets
                           if not (backend == "native" and t.arch == host)])
    return Settings(tuple(targets), backend, engine, float(timeout), padded)


def _check_engine(engine: str, targets: list[Target]) -> None:
    """That ``engine`` can run each emulated target (its profile)."""
    if engine == "auto" and not any(t.cpu for t in targets):
        return
    import elfloader
    from elfloader.backend.emulated import engine as engines
    seen = set()
    for t in targets:
        if (t.arch, t.cpu) in seen:
            continue
        seen.add((t.arch, t.cpu))
        try:
            engines.choose(elfloader.arch.by_name(t.arch), engine, t.cpu)
        except PortableKernelError as exc:
            what = f"--hal-engine={engine}" + (f" --hal-cpu={t.cpu}" if t.cpu
                                                else f" ({t.arch})")
            raise pytest.UsageError(f"{what}: {hal_spelling(exc.message)}"
                                    ) from None


def hal_spelling(text: str) -> str:
    """``text`` (an engine's message) with the command line's options
    spelled as this plugin's: ``--hal-engine=qemu``."""
    return (text.replace("engine='qemu' (--engine=qemu)", "--hal-engine=qemu")
            .replace("--engine=", "--hal-engine="))


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
                host = arches.host_arch()
                if host is None:
                    raise pytest.UsageError(
                        "--hal-arch=host: this machine's architecture is not "
                        "one the runtime runs; name architectures instead")
                picked = [host]
            else:
                picked = [arches.lookup(token, runtime=True).name]
            names += [n for n in picked if n not in names]
    except arches.FatElfSelectError as exc:
        raise pytest.UsageError(f"--hal-arch: {exc.message}") from None
    if not names:
        raise pytest.UsageError(f"--hal-arch={text!r} names no architecture")
    return names


_PROFILE = re.compile(r"^(?:(?P<arch>[^/:]+)/)?(?P<name>[^:]+)"
                      r"(?::(?:vlen|vl)=(?P<lengths>\d+(?:,\d+)*))?$")


def selected_profiles(values: list[str], allowed: list[str],
                      arch_text: str = "") -> list[Target]:
    """Targets for ``--hal-cpu`` values: each ``[ARCH/]PROFILE[:vlen=N,M]``
    (``vl=`` is a synonym) gives one target per vector length, for the
    architecture whose table has that profile
    (``fatelf.arches.profile(arch, name)``), which must be among
    ``allowed`` (``arch_text``: the ``--hal-arch`` value, for messages).

    Raises:
        pytest.UsageError: malformed value, unknown profile, a profile of an
            architecture not selected, or a vector length the profile
            cannot run at.
    """
    targets: list[Target] = []
    for item in (t.strip() for v in values for t in v.split(";") if t.strip()):
        m = _PROFILE.match(item)
        if not m:
            raise pytest.UsageError(
                f"--hal-cpu: {item!r} is not [ARCH/]PROFILE[:vlen=N,M,...]")
        name = m["name"].strip()
        if m["arch"]:
            try:
                candidates = [arches.lookup(m["arch"], runtime=True).name]
            except arches.FatElfSelectError as exc:
                raise pytest.UsageError(f"--hal-cpu: {exc.message}") from None
        else:
            candidates = list(arches.RUNTIME_ARCHES)
        found = []
        for arch in candidates:
            try:
                found.append(arches.profile(arch, name))
            except arches.FatElfSelectError:    # not a profile of this arch
                continue
        if not found:
            known = ", ".join(p.name for p in arches.PROFILES
                              if p.arch in candidates)
            raise pytest.UsageError(
                f"--hal-cpu: unknown CPU profile {name!r}"
                + (f" for {candidates[0]}" if m["arch"] else "")
                + f"; known: {known}")
        kept = [p for p in found if p.arch in allowed]
        if not kept:
            where = " and ".join(sorted({p.arch for p in found}))
            raise pytest.UsageError(
                f"--hal-cpu: {name} is a CPU profile of {where}, which "
                f"--hal-arch={arch_text or ','.join(allowed)} does not select")
        lengths = ([int(n) for n in m["lengths"].split(",")] if m["lengths"]
                   else [None])
        for profile in kept:
            for vlen in lengths:
                if vlen is not None and not profile.vlens:
                    raise pytest.UsageError(
                        f"--hal-cpu: {profile.name} has no scalable vectors: "
                        f"a vector length (in {item!r}) does not apply")
                if vlen is not None and vlen not in profile.vlens:
                    raise pytest.UsageError(
                        f"--hal-cpu: {profile.name} cannot run at a vector "
                        f"length of {vlen} bits; its lengths: "
                        f"{', '.join(map(str, sorted(profile.vlens)))}")
                t = Target(profile.arch, profile.name, vlen)
                if t not in targets:
                    targets.append(t)
    return targets


def targets_with_profiles(values: list[str], allowed: list[str],
                          arch_text: str = "") -> list[Target]:
    """Every architecture of ``allowed``, in order: the ``--hal-cpu``
    targets of those a profile names, the bare architecture for the
    others (they run at their defaults).

    Raises:
        pytest.UsageError: see :func:`selected_profiles`.
    """
    profiled = selected_profiles(values, allowed, arch_text)
    out: list[Target] = []
    for arch in allowed:
        mine = [t for t in profiled if t.arch == arch]
        out += mine or [Target(arch)]
    return out


def _targets(config) -> list[Target]:
    return list(settings(config).targets)


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
    """Mark ``exc`` to be shown as its report by the hook above (with the
    options a message suggests spelled as this plugin's)."""
    text = str(exc)
    spelled = hal_spelling(text)
    if spelled != text:
        exc.args = (spelled,)
        if isinstance(getattr(exc, "message", None), str):
            exc.message = hal_spelling(exc.message)
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
        backend: ``emulated`` or ``native`` (calls in a child process; a
            crash is run again emulated for its report).
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
        arrays: the :class:`hal_cpu.guarded.GuardedArrays` placed so far.
        timeout: the call limit, seconds.
        isolated: calls run natively, each in a child process.

    Raises:
        hal_cpu.PluginError, elfloader.ElfError: the plugin cannot be loaded.
    """

    def __init__(self, spec: str, arch: str, backend: str = "emulated", *,
                 timeout: float = DEFAULT_TIMEOUT, padded: bool | None = None,
                 strict: bool | None = None, engine: str | None = None,
                 **target_options):
        from .guarded import GuardedArrays, qemu_overread
        from .memory import GuestMemory
        from .plugins import PluginManager, PluginSpec
        self.spec, self.timeout = str(spec), timeout
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
                from .zigbuild import profile_image
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
        from .errors import NativeCrashError
        from .isolate import run_in_child
        from .plugins import PluginManager

        def trial(note):
            note("while loading the plugin")
            with PluginManager(arch, "native") as manager:
                manager.register_spec(parsed)

        try:
            run_in_child(trial, name=parsed.path, what="the plugin",
                         timeout=self.timeout)
        except NativeCrashError as exc:
            def load_emulated():
                LoadedPlugin(self.spec, arch, "emulated", timeout=self.timeout,
                             engine=self.engine).close()
            raise _reported(_with_emulated_run(exc, arch, "the load",
                                               load_emulated)) from None
        except PortableKernelError as exc:
            raise _reported(exc) from None

    @property
    def modules(self) -> list:
        """The loaded ELF modules of the manager's plugins (newest last)."""
        return [p.module for p in self.manager.plugins if hasattr(p, "module")]

    # -- arrays ----------------------------------------------------------------
    def array(self, values, *, name: str | None = None,
              align: int | None = None, padded: bool | None = None,
              strict: bool | None = None):
        """Copy ``values`` (any array-like) into guest memory between two
        guard pages (:mod:`hal_cpu.guarded`) and return the
        :class:`~hal_cpu.guarded.GuestArray`: pass it as a pointer field of
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
        """A guest array whose bytes are all 0xCD (:data:`hal_cpu.guarded.
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
        from .faults import field_names
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
            raise _reported(self._with_elements(err, names)) from None
        except PortableKernelError as exc:
            raise _reported(exc) from None

    def _with_elements(self, err, names: dict | None):
        """``err`` (a fault report) with a line after its data address
        saying, in elements of the test array the address lies outside of,
        how far the access reached: ``overrun:      src (float32[101], 404
        bytes): the access reached element 101, 1 float past the end``
        (with the access size where the engine knows it: unicorn)."""
        from .guarded import overrun_elements, qemu_overread_of
        address = getattr(err, "fault_address", None)
        if address is None:
            address = getattr(err, "fault_page", None)
        near = self.arrays.near(address) if address is not None else None
        if near is None:
            return err
        array, offset = near
        size = getattr(err, "access_size", None) or 0
        # past the end: the last byte the access touched; before the start:
        # the first
        reach = offset + size - 1 if size and offset >= 0 else offset
        report = getattr(err, "report", None)
        extra = (qemu_overread_of(report.instruction)
                 if report is not None and not size
                 and (report.engine or "").startswith("qemu") else 0)
        if extra and offset >= array.nbytes:
            # qemu-user loaded ``extra`` bytes past the operand: the operand
            # itself reached at least this far
            reach = offset - extra
        if 0 <= reach < array.nbytes:
            return err
        element = reach // max(1, array.dtype.itemsize)
        access = f"the {size}-byte access" if size else "the access"
        label = (names or {}).get(array, array.name)
        line = (f"  overrun:      {label} ({array.dtype}{list(array.shape)}, "
                f"{array.nbytes} bytes): {access} reached element {element}, "
                f"{overrun_elements(array, reach, reach)}")
        if extra and offset >= array.nbytes:
            line += (f" (its operand: qemu-user loads {extra} bytes past it, "
                     "up to the data address)")
        lines = str(err).split("\n")
        at = next((i + 1 for i, text in enumerate(lines)
                   if text.startswith("  data address:")), len(lines))
        lines.insert(at, line)
        message = "\n".join(lines)
        Exception.__init__(err, message)
        if isinstance(getattr(err, "message", None), str):
            err.message = message
        return err

    def _call_in_child(self, name: str, fn: int, params, ctx: int,
                       seconds: float, rerun=None) -> int:
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

        from .errors import NativeCrashError
        try:
            result, snapshot = run_in_child(
                child, name=self.modules[-1].name if self.modules else self.spec,
                what="the plugin", timeout=seconds)
        except NativeCrashError as exc:
            if rerun is not None:
                exc = _with_emulated_run(exc, self.arch, "the call", rerun)
            raise _reported(exc) from None
        except PortableKernelError as exc:
            if (getattr(exc, "fault", None) == "timeout"
                    and where not in str(exc)):
                exc.args = (f"{exc.args[0]} {where}",)
            raise _reported(exc) from None
        arrays.restore(snapshot)
        return result

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
        from .faults import bounds_error
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


#: Alignment of the params struct a call places (any C field's).
PARAMS_ALIGNMENT = 16


def _with_emulated_run(exc, arch: str, what: str, rerun):
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
    return settings(request.config).backend


@pytest.fixture
def hal_engine(request) -> str:
    """The emulation engine chosen with ``--hal-engine``: ``auto``
    (``$PKR_ENGINE``, else qemu-user where installed and sandboxed, else
    unicorn), ``qemu`` or ``unicorn``."""
    return settings(request.config).engine


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
    return settings(request.config).timeout


@pytest.fixture
def hal_plugin(request, hal_target, hal_backend, hal_engine, hal_timeout):
    """``hal_plugin(spec, padded=None)`` -> :class:`LoadedPlugin` for the
    current architecture: ``spec`` is a ``.sos`` bundle (its record for the
    architecture) or a ``.so``, with optional ``?key=value`` load
    parameters. Its ``array``/``zeros``/``empty`` place numpy arrays
    between guard pages (flush against the one after them, unless
    ``padded=True`` or ``--hal-padded-arrays``), ``call(name, layout,
    values)`` calls an import with a params struct, ``read`` gives arrays
    back. Everything is freed at the end of the test."""
    loaded: list[LoadedPlugin] = []

    def load(spec, padded: bool | None = None,
             strict: bool | None = None) -> LoadedPlugin:
        if padded is None and strict is None:
            padded = settings(request.config).padded
        plugin = LoadedPlugin(
            os.fspath(spec), hal_target.arch, hal_backend,
            timeout=hal_timeout, padded=padded, strict=strict,
            engine=hal_engine, **hal_target.options())
        loaded.append(plugin)
        return plugin

    yield load
    for plugin in loaded:
        plugin.close()


@pytest.fixture
def hal_executable(hal_target, hal_backend, hal_engine, hal_timeout):
    """``hal_executable(path, plugins=None)`` -> :class:`hal_cpu.Executable`
    for the current architecture (a FatELF picks its record), with imports
    resolved through ``plugins`` (a :class:`LoadedPlugin` or a plugin
    manager). Its ``dispatch`` runs under the time limit and Ctrl-C stops
    it; with ``--hal-backend=native`` each dispatch runs in a child
    process (a crash is run again emulated for its report). Closed at the
    end of the test."""
    from .library import Executable
    opened: list = []

    def emulated_options() -> dict:
        return dict(hal_target.options(), engine=hal_engine)

    def load(path, plugins=None):
        manager = getattr(plugins, "manager", plugins)
        isolated = (hal_backend == "native" and manager is None
                    and hal_target.arch == arches.host_arch())
        kind = "native" if isolated else "emulated"
        try:
            # (with plugins, the executable runs on their machine)
            exe = Executable(os.fspath(path), arch=hal_target.arch,
                             backend=kind, plugins=manager, timeout=hal_timeout,
                             **({} if manager or isolated
                                else emulated_options()))
        except PortableKernelError as exc:
            raise _reported(exc) from None
        opened.append(exe)

        def emulated():
            return Executable(os.fspath(path), arch=hal_target.arch,
                              backend="emulated", timeout=hal_timeout,
                              **emulated_options())

        _guard_dispatch(exe, hal_timeout, isolated, emulated)
        return exe

    yield load
    for exe in opened:
        exe.close()


#: More workers than a dispatch runs: stop them all.
_MOST_WORKERS = 256


def _guard_dispatch(exe, seconds: float, isolated: bool,
                    emulated=None) -> None:
    """Make ``exe.dispatch`` honour the time limit, Ctrl-C and, natively,
    run in a child process; its failures are shown as their reports (a
    native crash with the report of the dispatch run again on the
    executable ``emulated()`` opens)."""
    from .errors import NativeCrashError
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

                try:
                    run_in_child(child, name=exe.path, what="the kernel",
                                 timeout=seconds or None)
                except NativeCrashError as exc:
                    if emulated is None:
                        raise

                    def rerun():
                        # the bindings as they were before the dispatch
                        again = [np.array(b, copy=True) for b in bindings]
                        with emulated() as twin:
                            twin.dispatch(export, workgroup_count, again,
                                          constants, **kw)

                    raise _with_emulated_run(exc, exe.arch.name,
                                             "the dispatch", rerun) from None
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
