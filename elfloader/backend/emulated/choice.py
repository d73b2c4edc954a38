"""Which engine runs an architecture, and with which CPU model.

* qemu-user's facts per architecture (:data:`QEMU`: program, most capable
  ``-cpu`` model, vector lengths, where it reports fetch faults, arena;
  derived from each :class:`elfloader.arch.Arch`'s ``qemu`` record) and
  where its program is installed (:func:`qemu_program`);
* a CPU profile name and vector length resolved against
  :data:`fatelf.arches.PROFILES` (:func:`resolve_profile`);
* the choice between the engines (:func:`choose`: ``auto``, ``qemu``,
  ``unicorn``, ``$PKR_ENGINE``), which needs qemu-user installed and its
  sandbox (:mod:`.sandbox`) for ``auto`` to mean qemu.

The address space (:mod:`.space`) opens the chosen engine; the engine
modules read the qemu-user facts here. Nothing here starts qemu-user or
imports unicorn.
"""

from __future__ import annotations

import os
import shutil

from fatelf import arches

from ...arch import ARCHES, Arch, QemuUser
from ...errors import EngineError

ENGINES = ("auto", "qemu", "unicorn")

#: Environment variable naming a directory that holds ``qemu-<arch>``
#: (searched before ``PATH``).
QEMU_DIR_ENV = "PKR_QEMU_DIR"


#: What qemu-user runs an architecture's code with (the record is
#: :class:`elfloader.arch.QemuUser`, kept here under its former name).
QemuFacts = QemuUser

#: qemu-user's facts per runtime architecture, from each architecture's
#: :attr:`elfloader.arch.Arch.qemu` (every name in
#: :data:`fatelf.arches.RUNTIME_ARCHES` has a row).
QEMU: dict[str, QemuUser] = {a.name: a.qemu for a in ARCHES}

#: qemu-user's program name per architecture (from :data:`QEMU`).
QEMU_PROGRAMS = {name: facts.program for name, facts in QEMU.items()}

#: Environment variable that sets the engine ``"auto"`` stands for
#: (``qemu`` or ``unicorn``), e.g. to run a test suite on one engine.
ENGINE_ENV = "PKR_ENGINE"

INSTALL_HINT = ("install qemu-user (Debian/Ubuntu: apt-get install qemu-user) "
                f"or name its directory in ${QEMU_DIR_ENV}")


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
    return arch.qemu.vlens


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
    return decide(arch, engine, profile, qemu_program(arch))


def decide(arch: Arch, engine: str, profile: arches.Profile | None,
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
