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
  emulated), the others emulated. Each child is confined (no file
  created or written, no socket, no process started; see
  :func:`hal_cpu.isolate.confinement`) unless ``--hal-run-native``, which
  gives the code under test the rights of the pytest process. (The
  executable's and the plugin's own load run natively in the pytest
  process.)
* ``--hal-engine=auto|qemu|unicorn`` (default ``auto``: ``$PKR_ENGINE``,
  else qemu-user where it is installed and sandboxed, else unicorn): the
  emulation engine.
* ``--hal-timeout=SECONDS`` (default 60; 0: none): limit on every guest
  call the fixtures make; the ``hal_timeout(SECONDS)`` marker sets it per
  test. A call past it fails its test with a report of where it was.
* ``--hal-padded-arrays``: place arrays as IREE aligns its buffers (start
  64-byte aligned, up to 63 bytes of canary after the end) instead of
  flush against the guard page after them (the default, where even a
  one-element read past the end faults; see :mod:`hal_cpu.testing.guarded`).
  ``--hal-strict-bounds`` names the default.
* ``--hal-sanitize``: ``hal_executable``'s dispatches run on the qemu
  engine, one worker, under the workbench's kernel sanitizer
  (:mod:`hal_cpu.workbench`): a race between workgroups, an order
  dependence, never-written output bytes, an uninitialized read or an
  access outside a binding fails the test with the report.
  ``--hal-count-instructions=FILE.json`` counts each dispatch's
  instructions per workgroup on the qemu engine and writes them, by test,
  to ``FILE.json``.
* ``--hal-cpu=PROFILES``: run the tests of a profile's architecture once
  per CPU profile and vector length, e.g. ``--hal-cpu='rv64gcv:vlen=128,
  256,512'``, ``sve:vl=128,512``, ``x86-64-v3`` (repeatable, or several
  separated by ``;``); the other architectures run at their defaults.
  ``ARCH/PROFILE`` names the architecture when a profile name is not
  unique.

Fixtures (``pytest --fixtures`` lists them): ``hal_arch``, ``hal_cpu``,
``hal_vlen``, ``hal_backend``, ``hal_engine``, ``hal_timeout``,
``hal_plugin``, ``hal_executable``. What they return is built in
:mod:`hal_cpu.testing`, which needs no pytest: :class:`LoadedPlugin`
(re-exported here) and the guards of an executable's ``dispatch``.

A failure inside guest code called through the fixtures fails the test
with the fault report as its message (no traceback through the backend):
the plugin file, the import, the symbol and source line of the pc, the
instruction, and which array a data address lies outside of, how far in
bytes and in the array's elements.
The fixtures work under pytest-xdist (``pytest -n auto``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import pytest

from fatelf import arches
from fatelf.errors import PortableKernelError

from . import DEFAULT_TIMEOUT, LoadedPlugin, hal_spelling
from . import guard_dispatch as _guard_dispatch
from . import reported as _reported

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
    group.addoption("--hal-run-native", action="store_true",
                    help="with --hal-backend=native, run the children of the "
                         "native calls with this process's rights, "
                         "unconfined (default: confined: no file created or "
                         "written, no socket, no process started)")
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
    group.addoption("--hal-sanitize", action="store_true",
                    help="run hal_executable's dispatches under the kernel "
                    "sanitizer (qemu engine, one worker): races, order "
                    "dependences, never-written output bytes, uninitialized "
                    "reads and accesses outside bindings fail the test")
    group.addoption("--hal-count-instructions", default=None,
                    metavar="FILE.json", help="count the instructions of "
                    "hal_executable's dispatches per workgroup (qemu engine) "
                    "and write them, by test, to FILE.json")
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
        sandbox: native calls' children are confined (not
            ``--hal-run-native``).
    """

    targets: tuple[Target, ...]
    backend: str = "emulated"
    engine: str = "auto"
    timeout: float = DEFAULT_TIMEOUT
    padded: bool = False
    sandbox: bool = True


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
    return Settings(tuple(targets), backend, engine, float(timeout), padded,
                    not config.getoption("--hal-run-native"))


def _check_engine(engine: str, targets: list[Target]) -> None:
    """That ``engine`` can run each emulated target (its profile)."""
    if engine == "auto" and not any(t.cpu for t in targets):
        return
    import elfloader
    from elfloader.backend.emulated import choice
    seen = set()
    for t in targets:
        if (t.arch, t.cpu) in seen:
            continue
        seen.add((t.arch, t.cpu))
        try:
            choice.choose(elfloader.arch.by_name(t.arch), engine, t.cpu)
        except PortableKernelError as exc:
            what = f"--hal-engine={engine}" + (f" --hal-cpu={t.cpu}" if t.cpu
                                                else f" ({t.arch})")
            raise pytest.UsageError(f"{what}: {hal_spelling(exc.message)}"
                                    ) from None


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
            engine=hal_engine, sandbox=settings(request.config).sandbox,
            **hal_target.options())
        loaded.append(plugin)
        return plugin

    yield load
    for plugin in loaded:
        plugin.close()


@pytest.fixture
def hal_executable(request, hal_target, hal_backend, hal_engine, hal_timeout):
    """``hal_executable(path, plugins=None)`` -> :class:`hal_cpu.Executable`
    for the current architecture (a FatELF picks its record), with imports
    resolved through ``plugins`` (a :class:`LoadedPlugin` or a plugin
    manager). Its ``dispatch`` runs under the time limit and Ctrl-C stops
    it; with ``--hal-backend=native`` each dispatch runs in a child
    process (a crash is run again emulated for its report). Closed at the
    end of the test."""
    from ..library import Executable
    opened: list = []
    watched = _workbench_session(request)
    if watched is not None:
        hal_backend, hal_engine = "emulated", "qemu"

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

        _guard_dispatch(exe, hal_timeout, isolated, emulated,
                        sandbox=settings(request.config).sandbox)
        if watched is not None and watched.sanitize:
            _one_worker(exe)
        return exe

    yield load
    for exe in opened:
        exe.close()
    if watched is not None:
        watched.__exit__(None, None, None)
        _keep_counts(request, watched)


def _workbench_session(request):
    """The workbench session ``--hal-sanitize`` / ``--hal-count-
    instructions`` ask for (entered), or None."""
    config = request.config
    sanitize = config.getoption("--hal-sanitize", False)
    counts = config.getoption("--hal-count-instructions", None)
    if not sanitize and not counts:
        return None
    from ..workbench import FindingsError, Session

    def check(report) -> None:
        if report.findings or report.unseen or report.lost:
            exc = FindingsError(report.text(), name=report.export,
                                    field="--hal-sanitize",
                                    value=len(report.findings))
            exc.hal_report = True  # type: ignore[attr-defined]
            raise exc
    session = Session(sanitize=bool(sanitize), count=bool(counts),
                      on_report=check if sanitize else None)
    return session.__enter__()


def _one_worker(exe) -> None:
    """Make ``exe.dispatch`` run one worker (the sanitizer's)."""
    dispatch = exe.dispatch

    def one(*args, **kwargs):
        kwargs["workers"] = 1
        return dispatch(*args, **kwargs)
    exe.dispatch = one


def _keep_counts(request, session) -> None:
    """Add the test's counts to ``--hal-count-instructions``'s file."""
    path = request.config.getoption("--hal-count-instructions", None)
    if not path:
        return
    import json
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    data[request.node.nodeid] = [r.counts_json() for r in session.reports
                                 if r.counts is not None]
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")



