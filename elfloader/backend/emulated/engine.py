"""The engine contract: what an emulated address space
(:class:`~.space.EmulatedBackend`) needs from the thing that runs guest
code, and the choice between the two engines.

Two engines run guest code:

* ``qemu`` (:mod:`.qemu_engine`): a guest agent, a small static Linux
  program of the guest architecture, runs under qemu-user in a child
  process and maps the backend's guest memory (a ``memfd``). It runs the
  vector ISAs real kernels use (AVX2/FMA, SVE/SVE2 at any vector length,
  RVV 1.0 at any VLEN, NEON) at qemu-user's speed. Needs ``qemu-<arch>``
  (Debian/Ubuntu package ``qemu-user``).
* ``unicorn`` (:mod:`.unicorn_engine`): unicorn 2.1 CPUs in this process
  (QEMU 5.0: no AVX/AVX2/FMA, no RVV 1.0, no SVE). Needs nothing more
  than the ``unicorn`` wheel.

An engine hands the address space its arena (the guest addresses it may
allocate), host memory for each reservation (:class:`Region`), and CPUs
(:class:`Cpu`): each CPU has its own registers and stack, applies the
space's memory-map log before its calls, runs one call at a time and can
be stopped from another thread. Only the engine modules import unicorn or
start qemu-user.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fatelf import arches

from ...arch import Arch
from ...errors import BackendError, EngineError

if TYPE_CHECKING:
    from .space import EmulatedBackend

ENGINES = ("auto", "qemu", "unicorn")

#: Environment variable naming a directory that holds ``qemu-<arch>``
#: (searched before ``PATH``).
QEMU_DIR_ENV = "PKR_QEMU_DIR"


@dataclass(frozen=True)
class QemuFacts:
    """What qemu-user runs an architecture's code with.

    Attributes:
        program: qemu-user's program name, e.g. ``qemu-i386``.
        vector_profile: ``(architecture, profile)`` in
            :data:`fatelf.arches.PROFILES` whose scalable vectors the most
            capable model has: its vector lengths (default first) are the
            model's, and without :attr:`model` its ``-cpu`` option is the
            model's; None: no scalable vectors.
        model: ``-cpu`` option of the most capable model, ``{vlen}``,
            ``{vq}`` and ``{vlenb}`` standing for the vector length; None:
            the vector profile's option followed by :attr:`extra`.
        extra: ``-cpu`` properties added to the vector profile's option.
        branches: mnemonic starts of the calls, jumps and returns at whose
            pc qemu-user reports a fault fetching their target (real CPUs
            and unicorn: at the target); empty: at the target.
    """

    program: str
    vector_profile: tuple[str, str] | None = None
    model: str | None = None
    extra: str = ""
    branches: tuple[str, ...] = ()

    @property
    def vlens(self) -> tuple[int, ...]:
        """Vector lengths in bits of the most capable model (its default
        first); empty without scalable vectors."""
        if self.vector_profile is None:
            return ()
        return arches.profile(*self.vector_profile).vlens

    @property
    def max_model(self) -> str:
        """``-cpu`` option of the most capable model (see :attr:`model`)."""
        if self.model is not None:
            return self.model
        if self.vector_profile is None:
            return "max"
        return arches.profile(*self.vector_profile).qemu_cpu + self.extra


_BITMANIP = ",zba=true,zbb=true,zbc=true,zbs=true"
_X86_BRANCHES = ("call", "jmp", "ret", "j", "loop")

#: qemu-user's facts per runtime architecture (every name in
#: :data:`fatelf.arches.RUNTIME_ARCHES` has a row).
QEMU: dict[str, QemuFacts] = {
    "x86_64": QemuFacts("qemu-x86_64", branches=_X86_BRANCHES),
    "x86_32": QemuFacts("qemu-i386", branches=_X86_BRANCHES),
    "aarch64": QemuFacts("qemu-aarch64", ("aarch64", "sve")),
    "arm32": QemuFacts("qemu-arm"),
    "riscv64": QemuFacts("qemu-riscv64", ("riscv64", "rv64gcv"),
                         extra=_BITMANIP),
    # Full RVV 1.0 on rv32 (no rv32 profile has it), at RVV's lengths.
    "riscv32": QemuFacts("qemu-riscv32", ("riscv64", "rv64gcv"),
                         model="rv32,v=true,vlen={vlen},elen=64,"
                               "vext_spec=v1.0" + _BITMANIP),
}

#: qemu-user's program name per architecture (from :data:`QEMU`).
QEMU_PROGRAMS = {name: facts.program for name, facts in QEMU.items()}

#: Environment variable that sets the engine ``"auto"`` stands for
#: (``qemu`` or ``unicorn``), e.g. to run a test suite on one engine.
ENGINE_ENV = "PKR_ENGINE"

INSTALL_HINT = ("install qemu-user (Debian/Ubuntu: apt-get install qemu-user) "
                f"or name its directory in ${QEMU_DIR_ENV}")


#: Faults by (access, mapped): the ``fault`` attribute of the
#: :class:`EmulationError` and the start of its message.
FAULTS = {
    ("read", False): ("read_unmapped", "read from unmapped memory"),
    ("write", False): ("write_unmapped", "write to unmapped memory"),
    ("fetch", False): ("fetch_unmapped", "instruction fetch from unmapped memory"),
    ("read", True): ("read_protected", "read from unreadable memory"),
    ("write", True): ("write_protected", "write to read-only memory"),
    ("fetch", True): ("fetch_protected",
                      "instruction fetch from non-executable memory"),
}


class Region(Protocol):
    """Host memory behind one reservation of the address space."""

    address: int     # guest address
    size: int        # bytes, whole pages
    host: int        # host address of the first byte

    def free(self) -> None:
        """Give the host memory back."""


class Cpu:
    """State every engine's CPU shares; the engine modules subclass it.

    Attributes:
        page_size: the engine's page size, bytes.
        _thread: ident of the thread running a call, or None.
        _gen: entries of the space's memory-map log this CPU has applied.
    """

    page_size = 4096

    def __init__(self, space: "EmulatedBackend"):
        self._space = space
        self.arch = space.arch
        self._thread: int | None = None
        self._gen = 0
        self._closed = False
        self._stop = False
        self._stack: int | None = None
        self._stack_top = 0

    # --- what the engines implement -----------------------------------------
    def call(self, address: int, *args: int) -> int:
        """Call ``address`` with integer arguments (see
        :meth:`elfloader.backend.Backend.call`).

        Raises:
            EmulationError: the CPU faulted, was stopped, or ran past the
                space's ``timeout_us``.
            BackendError: the space or this CPU is closed, or this CPU is
                already running a call.
        """
        raise NotImplementedError

    def stop(self) -> None:
        """Ask the running call (on another thread) to end as soon as
        possible; it raises :class:`EmulationError` with ``fault``
        ``"stopped"``. Does nothing when the CPU is idle."""
        raise NotImplementedError

    def _sync(self) -> None:
        """Apply the space's memory-map log entries this CPU has not seen.
        Called with the space's lock held, when this CPU is not running or
        from its own callback."""
        raise NotImplementedError

    def _map_all(self) -> None:
        """Map the space's whole address space into this new CPU. Called
        with the space's lock held."""
        raise NotImplementedError

    def _start(self, stack: int) -> None:
        """Use ``stack`` (the lowest address of a stack of
        ``space.STACK_SIZE`` bytes) for calls."""
        from .space import STACK_SIZE
        self._stack = stack
        self._stack_top = stack + STACK_SIZE - 64

    def _close_engine(self) -> None:
        """Free the engine's resources of this CPU now."""
        raise NotImplementedError

    # --- shared -------------------------------------------------------------
    def _enter(self, address: int) -> None:
        """Mark this CPU as running a call on this thread, after applying
        pending memory-map changes."""
        space = self._space
        with space._lock:
            if self._closed or space._closed:
                raise BackendError("the emulated backend is closed",
                                   field="call", value=address)
            me = threading.get_ident()
            for c in space._cpus:
                if c._thread == me:
                    raise BackendError("a Python callback may not call back "
                                       "into emulated code", field="call",
                                       value=address)
            if self._thread is not None:
                raise BackendError("this CPU is running another call (use "
                                   "fork_cpu() for one CPU per thread)",
                                   field="call", value=address)
            self._sync()
            self._thread = me
            self._stop = False

    def _leave(self) -> None:
        self._thread = None
        space = self._space
        if space._log or space._dead:
            with space._lock:
                space._trim()

    def close(self) -> None:
        """Free this CPU (not the backend's own: close the backend). Its
        stack goes back to the backend."""
        space = self._space
        with space._lock:
            if self._closed:
                return
            if self is space.cpu:
                raise BackendError("the backend's own CPU closes with the "
                                   "backend", field="close", value=None)
            if self._thread is not None:
                raise BackendError("cannot close a CPU while it runs a call",
                                   field="close", value=None)
            space._cpus.remove(self)
            self._close_engine()
            if self._stack is not None and not space._closed:
                space._release_stack(self._stack)
            space._trim()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Engine:
    """One engine serving one address space.

    Attributes:
        name: ``"qemu"`` or ``"unicorn"``.
        profile: the CPU profile its CPUs model, or None (the most capable
            model the engine has).
        vlen: vector length in bits of a scalable profile (or of the
            default model), else None.
        arena: ``(start, end)`` guest addresses the space may allocate.
        eager_sync: memory-map changes are cheap for this engine's CPUs:
            idle ones apply them at once.
        defer_free: a released reservation's host memory must outlive the
            CPUs that may still run on it (freed once every CPU unmapped
            it); False when it can be freed at once.
    """

    name = ""
    eager_sync = True
    defer_free = True

    def __init__(self, arch: Arch, profile: arches.Profile | None,
                 vlen: int | None):
        self.arch = arch
        self.profile = profile
        self.vlen = vlen
        self.arena = (0, 0)

    def region(self, address: int, size: int) -> Region:
        """Zeroed read/write host memory for the reservation
        ``[address, address + size)``."""
        raise NotImplementedError

    def new_cpu(self, space: "EmulatedBackend") -> Cpu:
        """A new CPU of ``space`` (not yet started)."""
        raise NotImplementedError

    def setup(self, space: "EmulatedBackend", slots: int) -> list[int]:
        """Prepare ``space`` once its first CPU and stack exist; returns the
        guest addresses of ``slots`` callback entry points, in order."""
        raise NotImplementedError

    def describe(self) -> str:
        """``engine, CPU model`` for messages and ``--verbose``."""
        cpu = self.profile.name if self.profile else "most capable model"
        if self.vlen:
            cpu += f", vector length {self.vlen} bits"
        return f"{self.name} ({cpu})"

    def close(self) -> None:
        """Free what the engine holds for the space (after its CPUs)."""


def qemu_program(arch: Arch | str) -> str | None:
    """Path of ``qemu-<arch>`` (or ``qemu-<arch>-static``), looked up in
    ``$PKR_QEMU_DIR`` then ``PATH``; None when it is not installed."""
    name = arch if isinstance(arch, str) else arch.name
    program = QEMU_PROGRAMS.get(name)
    if program is None:
        return None
    folder = os.environ.get(QEMU_DIR_ENV)
    for candidate in (program, program + "-static"):
        if folder:
            path = os.path.join(folder, candidate)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        found = shutil.which(candidate)
        if found:
            return found
    return None


def resolve_profile(arch: Arch, cpu: str | None,
                    vlen: int | None) -> tuple[arches.Profile | None, int | None]:
    """The profile named ``cpu`` and the vector length to run it at.

    Raises:
        EngineError: unknown profile, or ``vlen`` given for a fixed-width
            profile or outside the profile's lengths.
    """
    profile = None
    if cpu:
        try:
            profile = arches.profile(arch.name, cpu)
        except arches.FatElfSelectError as exc:
            raise EngineError(exc.message, field="cpu", value=cpu) from None
    if vlen is None:
        return profile, (profile.vlens[0] if profile and profile.vlens else None)
    try:
        vlen = int(vlen)
    except (TypeError, ValueError):
        raise EngineError(f"vector length {vlen!r} is not a number of bits",
                          field="vlen", value=vlen) from None
    allowed = profile.vlens if profile else _default_vlens(arch)
    if not allowed:
        what = f"profile {profile.name}" if profile else f"{arch.name}"
        raise EngineError(f"{what} has no scalable vectors: --vlen does not "
                          f"apply", field="vlen", value=vlen)
    if vlen not in allowed:
        raise EngineError(f"vector length {vlen} bits is not one of "
                          f"{', '.join(map(str, sorted(allowed)))}",
                          field="vlen", value=vlen)
    return profile, vlen


def _default_vlens(arch: Arch) -> tuple[int, ...]:
    """Vector lengths of the most capable model (no profile): SVE on
    aarch64, RVV on riscv; empty without scalable vectors."""
    facts = QEMU.get(arch.name)
    return facts.vlens if facts else ()


def default_vlen(arch: Arch) -> int | None:
    """Vector length in bits of the most capable model, or None."""
    lengths = _default_vlens(arch)
    return lengths[0] if lengths else None


def choose(arch: Arch, engine: str = "auto", cpu: str | None = None) -> str:
    """The engine that will run ``arch`` (profile ``cpu``):
    ``"qemu"`` or ``"unicorn"``. ``"auto"`` means ``$PKR_ENGINE`` when set,
    else qemu-user where it is installed and its sandbox can be made
    (:mod:`.sandbox`), else unicorn.

    Raises:
        EngineError: unknown engine or profile; ``"qemu"`` asked for
            without qemu-user; a profile unicorn cannot run and no
            qemu-user.
    """
    profile, _ = resolve_profile(arch, cpu, None)
    return _choose(arch, engine, profile, qemu_program(arch))


def _choose(arch: Arch, engine: str, profile: arches.Profile | None,
            program: str | None) -> str:
    """:func:`choose` for a resolved profile and the path of ``qemu-<arch>``
    (None: not installed)."""
    if engine == "auto" and os.environ.get(ENGINE_ENV):
        engine = os.environ[ENGINE_ENV].strip().lower()
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; use one of "
                          f"{', '.join(ENGINES)}", field="engine", value=engine)
    have_qemu = program is not None
    if engine == "qemu":
        if not have_qemu:
            raise EngineError(f"the qemu engine needs "
                              f"{QEMU_PROGRAMS.get(arch.name, 'qemu-user')}: "
                              f"{INSTALL_HINT}", field="engine", value=engine)
        return "qemu"
    if engine == "unicorn":
        if profile is not None and not profile.unicorn:
            how = ("engine='qemu' (--engine=qemu)" if have_qemu
                   else INSTALL_HINT)
            raise EngineError(f"unicorn cannot run CPU profile {profile.name} "
                              f"({profile.summary}); use the qemu engine: "
                              f"{how}", field="cpu", value=profile.name)
        return "unicorn"
    if have_qemu:
        # qemu-user runs guest code only in its sandbox: without one, auto
        # means unicorn unless the profile needs qemu (whose engine then
        # says why it cannot start).
        from . import sandbox
        if sandbox.status()["seccomp"] or (profile is not None
                                           and not profile.unicorn):
            return "qemu"
    if profile is not None and not profile.unicorn:
        raise EngineError(f"CPU profile {profile.name} ({profile.summary}) "
                          f"needs the qemu engine, and "
                          f"{QEMU_PROGRAMS[arch.name]} is not installed: "
                          f"{INSTALL_HINT}", field="cpu", value=profile.name)
    return "unicorn"


def open_engine(arch: Arch, engine: str = "auto", cpu: str | None = None,
                vlen: int | None = None) -> Engine:
    """The engine for a new address space; see :func:`choose`."""
    profile, vlen = resolve_profile(arch, cpu, vlen)
    program = qemu_program(arch)
    if _choose(arch, engine, profile, program) == "qemu":
        from .qemu_engine import QemuEngine
        return QemuEngine(arch, profile, vlen or (None if profile
                                                  else default_vlen(arch)),
                          program)
    if vlen is not None and profile is None:
        raise EngineError("unicorn models no scalable vectors: --vlen needs "
                          "the qemu engine", field="vlen", value=vlen)
    from .unicorn_engine import UnicornEngine
    return UnicornEngine(arch, profile, None)
