"""The project's one architecture table, and FatELF's names for targets.

Every layer (``fatelf``, ``elfloader``, ``hal_cpu``, both command lines, the
build scripts, the tests and the benchmarks) takes what it knows about an
architecture's identity from :data:`TABLE`: its name and aliases, its ELF
identity (``e_machine``, class, byte order, ABI), the ``iree-compile`` flags
that target it, the zig target that builds freestanding code for it, its
default CPU profile, the ``platform.machine()`` values of hosts that run it
and, for a 64-bit family, its 32-bit member. Its named CPU profiles are the
:data:`PROFILES` rows. Both sit here, in the lowest package, because every
layer resolves names and profiles (FatELF records, ``--cpu``,
``iree-compile`` and zig flags); what only the loader and the engines need
(psABI, emulators, the agent and the per-architecture builds) is the
architecture's module in ``elfloader/arch/``, whose :class:`Arch` record
starts from the row here.

ELF machine and OSABI numbers are the ``e_machine`` and ``e_ident[EI_OSABI]``
values of the System V gABI ("ELF header", ch. 4). An architecture name
stands for an (e_machine, word size) pair, e.g. ``x86_64`` is (62, 64) and
``riscv32`` is (243, 32). Records whose ELF is big-endian get a ``_be``
suffix (``aarch64_be``); :func:`parse_arch` accepts that suffix (and
``_le``) and turns it into a byte order.
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass

from .errors import FatElfSelectError


@dataclass(frozen=True)
class ArchInfo:
    """Identity of one architecture, and how the toolchains name it.

    Attributes:
        name: canonical name (``x86_64``, ``aarch64``, ``riscv64``,
            ``x86_32``, ``arm32``, ``riscv32``...); also the FatELF name.
        aliases: other accepted spellings, lower case (``amd64``, ``arm64``).
        machine: ELF ``e_machine``.
        elf_class: 32 or 64 (``EI_CLASS``); also the pointer width in bits.
        byte_order: ``"little"`` or ``"big"`` (``EI_DATA``).
        abi: the C ABI the runtime's code follows (psABI name and variant).
        elf_flags: ``e_flags`` the supported toolchains emit (0 when the
            psABI defines none).
        runtime: True when :mod:`elfloader` can load and run its code.
        iree_flags: ``iree-compile`` flags selecting this target
            (``--iree-llvmcpu-target-triple=...`` and friends).
        iree_variant: suffix of IREE's executable format and variant name
            (``embedded-elf-<x>`` format, ``embedded_elf_<x>`` variant).
        zig_flags: ``python -m ziglang cc`` flags building freestanding code.
        host_names: ``platform.machine()`` values (lower case) of hosts whose
            CPU runs this architecture's code.
        default_profile: name of the :data:`PROFILES` row its plain name
            compiles for ("" outside the runtime's architectures).
        narrow: for a 64-bit family, the name of its 32-bit member, which a
            32-bit interpreter on such a host runs (:func:`host`); else "".
    """

    name: str
    machine: int
    elf_class: int
    aliases: tuple[str, ...] = ()
    byte_order: str = "little"
    abi: str = ""
    elf_flags: int = 0
    runtime: bool = False
    iree_flags: tuple[str, ...] = ()
    iree_variant: str = ""
    zig_flags: tuple[str, ...] = ()
    host_names: tuple[str, ...] = ()
    default_profile: str = ""
    narrow: str = ""

    @property
    def pointer_size(self) -> int:
        """Pointer width in bytes (4 or 8)."""
        return self.elf_class // 8

    @property
    def iree_format(self) -> str:
        """IREE's ``--executable_format`` value, e.g. ``embedded-elf-x86_64``."""
        return "embedded-elf-" + self.iree_variant

    @property
    def target(self) -> tuple[int, int]:
        """(e_machine, word size in bits): what a FatELF record matches."""
        return self.machine, self.elf_class


_GENERIC = ("--iree-llvmcpu-target-cpu=generic",)

#: Every architecture the project names, the six it runs first.
TABLE: tuple[ArchInfo, ...] = (
    ArchInfo("x86_64", 62, 64, ("amd64", "x64", "x86-64"),
             abi="System V AMD64", runtime=True,
             iree_flags=("--iree-llvmcpu-target-triple=x86_64-pc-linux-elf",) + _GENERIC,
             iree_variant="x86_64", zig_flags=("-target", "x86_64-freestanding-none"),
             host_names=("x86_64", "amd64"), default_profile="x86-64", narrow="x86_32"),
    ArchInfo("aarch64", 183, 64, ("arm64", "arm_64", "armv8"),
             abi="AAPCS64", runtime=True,
             iree_flags=("--iree-llvmcpu-target-triple=aarch64-pc-linux-elf",) + _GENERIC,
             iree_variant="arm_64", zig_flags=("-target", "aarch64-freestanding-none"),
             host_names=("aarch64", "arm64"), default_profile="armv8-a", narrow="arm32"),
    ArchInfo("riscv64", 243, 64, ("rv64", "riscv_64"),
             abi="RISC-V LP64D", elf_flags=0x5, runtime=True,  # RVC | FLOAT_ABI_DOUBLE
             iree_flags=("--iree-llvmcpu-target-triple=riscv64-pc-linux-elf",
                         "--iree-llvmcpu-target-cpu=generic-rv64",
                         "--iree-llvmcpu-target-cpu-features=+m,+a,+f,+d,+c",
                         "--iree-llvmcpu-target-abi=lp64d"),
             iree_variant="riscv_64",
             zig_flags=("-target", "riscv64-freestanding-none",
                        "-mcpu=generic_rv64+m+a+f+d+c"),
             host_names=("riscv64",), default_profile="rv64gc", narrow="riscv32"),
    ArchInfo("x86_32", 3, 32, ("i386", "i486", "i586", "i686", "x86", "ia32", "x86_32"),
             abi="System V i386 (cdecl)", runtime=True,
             # SSE2 (Pentium 4): x87-only code computes f32 with excess
             # precision, and IREE's results then differ from x86_64's.
             # (zig's x86 baseline is SSE2 too.)
             iree_flags=("--iree-llvmcpu-target-triple=i686-pc-linux-elf",
                         "--iree-llvmcpu-target-cpu=pentium4"),
             iree_variant="x86_32", zig_flags=("-target", "x86-freestanding-none"),
             host_names=("i386", "i486", "i586", "i686", "x86"),
             default_profile="pentium4"),
    ArchInfo("arm32", 40, 32, ("arm", "armv7", "armv7l", "armv7a", "armhf", "arm_32",
                               "armv6l", "armv8l"),
             abi="AAPCS hard-float (EABI5)", elf_flags=0x05000400, runtime=True,
             # NEON + VFPv4 + integer divide: generic armv7-a makes
             # iree-compile 3.13 call fmaf (exp, log, tanh, sin) in software
             # and leave __aeabi_idiv/__aeabi_idivmod undefined.
             iree_flags=("--iree-llvmcpu-target-triple=armv7a-pc-linux-elf",
                         "--iree-llvmcpu-target-cpu=generic",
                         "--iree-llvmcpu-target-cpu-features=+neon,+vfp4,+hwdiv-arm",
                         "--iree-llvmcpu-target-float-abi=hard"),
             iree_variant="arm_32",
             zig_flags=("-target", "arm-freestanding-eabihf", "-mcpu=cortex_a15"),
             host_names=("armv7l", "armv7", "armv8l", "armv6l", "arm"),
             default_profile="armv7-a+neon+vfp4+hwdiv"),
    ArchInfo("riscv32", 243, 32, ("rv32", "riscv_32"),
             abi="RISC-V ILP32", runtime=True,
             iree_flags=("--iree-llvmcpu-target-triple=riscv32-pc-linux-elf",
                         "--iree-llvmcpu-target-cpu=generic-rv32",
                         "--iree-llvmcpu-target-cpu-features=+m,+f",
                         "--iree-llvmcpu-target-abi=ilp32"),
             iree_variant="riscv_32",
             zig_flags=("-target", "riscv32-freestanding-none", "-mcpu=generic_rv32+m+f"),
             host_names=("riscv32",), default_profile="rv32imf"),
    # Named for FatELF bundles only: the loader does not run these.
    ArchInfo("ppc32", 20, 32, ("ppc", "powerpc"), byte_order="big"),
    ArchInfo("ppc64", 21, 64, ("ppc64le", "powerpc64", "powerpc64le"),
             host_names=("ppc64", "ppc64le"), narrow="ppc32"),
    ArchInfo("mips32", 8, 32, ("mips", "mipsel"), host_names=("mips",)),
    ArchInfo("mips64", 8, 64, ("mips64el",), host_names=("mips64",), narrow="mips32"),
    ArchInfo("s390x", 22, 64, byte_order="big", host_names=("s390x",)),
    ArchInfo("loongarch64", 258, 64, ("loong64",), host_names=("loongarch64",)),
)

#: Names of the architectures the runtime loads and runs, in table order.
RUNTIME_ARCHES: tuple[str, ...] = tuple(a.name for a in TABLE if a.runtime)

#: Canonical architecture name -> (e_machine, word size in bits).
ARCHES: dict[str, tuple[int, int]] = {a.name: a.target for a in TABLE}

#: Other spellings -> canonical name.
ALIASES: dict[str, str] = {alias: a.name for a in TABLE for alias in a.aliases
                           if alias != a.name}

_BY_NAME: dict[str, ArchInfo] = {a.name: a for a in TABLE}
for _a in TABLE:
    for _n in _a.aliases:
        _BY_NAME.setdefault(_n, _a)
_BY_TARGET: dict[tuple[int, int], ArchInfo] = {a.target: a for a in TABLE}

#: e_machine -> symbolic constant name (used by ``dump`` and ``info``).
MACHINE_NAMES: dict[int, str] = {
    0: "EM_NONE", 3: "EM_386", 8: "EM_MIPS", 20: "EM_PPC", 21: "EM_PPC64",
    22: "EM_S390", 40: "EM_ARM", 62: "EM_X86_64", 183: "EM_AARCH64",
    243: "EM_RISCV", 258: "EM_LOONGARCH",
}

#: e_ident[EI_OSABI] -> short name (gABI table; 0 is ELFOSABI_NONE/SYSV).
OSABI_NAMES: dict[int, str] = {
    0: "none", 1: "hpux", 2: "netbsd", 3: "linux", 4: "hurd", 6: "solaris",
    7: "aix", 8: "irix", 9: "freebsd", 10: "tru64", 11: "modesto",
    12: "openbsd", 13: "openvms", 14: "nsk", 15: "aros", 16: "fenixos",
    17: "cloudabi", 18: "openvos", 97: "armabi", 255: "standalone",
}

#: OSABI values a runtime loader accepts when selecting a record: the ELF
#: must either claim no OS, Linux, or be standalone (the IREE runtime's rule).
RUNTIME_OSABIS: frozenset[int] = frozenset({0, 3, 255})


def known_names(runtime_only: bool = False) -> str:
    """The accepted names, for error messages."""
    arches = [a for a in TABLE if a.runtime or not runtime_only]
    aliases = sorted(n for a in arches for n in a.aliases if n != a.name)
    return ", ".join(a.name for a in arches) + " (aliases: " + ", ".join(aliases) + ")"


def lookup(name: str, *, runtime: bool = False) -> ArchInfo:
    """The architecture called ``name`` (canonical name or alias, any case).

    Args:
        name: e.g. ``x86_64``, ``arm64``, ``i686``, ``rv32``.
        runtime: only accept architectures the runtime runs.

    Raises:
        FatElfSelectError: unknown name (field ``arch``); the message lists
            the accepted names.
    """
    key = str(name).strip().lower()
    info = _BY_NAME.get(key)
    if info is None or (runtime and not info.runtime):
        what = "unknown" if info is None else "unsupported"
        raise FatElfSelectError(f"{what} architecture {name!r}; known: "
                                f"{known_names(runtime)}", field="arch", value=name)
    return info


def by_target(machine: int, elf_class: int) -> ArchInfo | None:
    """The architecture of ELF ``e_machine`` and class (32 or 64), or None."""
    return _BY_TARGET.get((machine, elf_class))


@dataclass(frozen=True)
class Profile:
    """A CPU profile: one real CPU's instruction set, named, with how each
    tool targets it.

    Attributes:
        name: e.g. ``x86-64-v3``, ``sve``, ``rv64gcv``.
        arch: canonical architecture name.
        summary: one line naming the ISA extensions.
        iree_flags: ``iree-compile`` flags selecting the architecture and
            this CPU (they replace :attr:`ArchInfo.iree_flags`).
        zig_flags: ``python -m ziglang cc`` flags building freestanding
            code for this CPU (they replace :attr:`ArchInfo.zig_flags`).
        qemu_cpu: qemu-user's ``-cpu`` option; ``{vlen}`` (bits),
            ``{vlenb}`` (bytes) and ``{vq}`` (128-bit units) stand for the
            vector length of a scalable profile.
        unicorn: whether the unicorn engine runs this CPU's code (its
            QEMU 5.0 lacks AVX/AVX2/FMA, RVV 1.0 and SVE).
        vlens: vector lengths in bits a scalable profile can run at (its
            default first); empty for fixed-width ISAs.
        note: what a user picking this profile must know, or "".
    """

    name: str
    arch: str
    summary: str
    iree_flags: tuple[str, ...]
    zig_flags: tuple[str, ...]
    qemu_cpu: str
    unicorn: bool = False
    vlens: tuple[int, ...] = ()
    note: str = ""

    def qemu_cpu_option(self, vlen: int | None = None) -> str:
        """The ``-cpu`` value for vector length ``vlen`` (bits; None: the
        default)."""
        vlen = vlen or (self.vlens[0] if self.vlens else 128)
        return self.qemu_cpu.format(vlen=vlen, vlenb=vlen // 8, vq=vlen // 128)


_X64 = "--iree-llvmcpu-target-triple=x86_64-pc-linux-elf"
_A64 = "--iree-llvmcpu-target-triple=aarch64-pc-linux-elf"
_RV64 = ("--iree-llvmcpu-target-triple=riscv64-pc-linux-elf",
         "--iree-llvmcpu-target-cpu=generic-rv64")
_RV32 = ("--iree-llvmcpu-target-triple=riscv32-pc-linux-elf",
         "--iree-llvmcpu-target-cpu=generic-rv32")
_X86 = "--iree-llvmcpu-target-triple=i686-pc-linux-elf"
_ARM = "--iree-llvmcpu-target-triple=armv7a-pc-linux-elf"
_SVE_VLENS = (512, 128, 256, 1024, 2048)
_RVV_VLENS = (256, 128, 512, 1024)
_X87_NOTE = ("x87 arithmetic keeps 64-bit mantissas between operations "
             "(excess precision): some f32 results differ from SSE2's, and "
             "iree-compile's roundf returns 0.7 for 0.7, as on a real i686 "
             "under Linux (and on qemu; unicorn's x87 starts at single "
             "precision); pentium4 (SSE2) gives x86_64's results")

#: Named CPU profiles of each architecture the runtime runs.
PROFILES: tuple[Profile, ...] = (
    Profile("x86-64", "x86_64", "x86-64 baseline (SSE2)",
            (_X64, "--iree-llvmcpu-target-cpu=x86-64"),
            ("-target", "x86_64-freestanding-none", "-mcpu=x86_64"),
            "qemu64", unicorn=True),
    Profile("x86-64-v2", "x86_64", "x86-64-v2 (SSE4.2, POPCNT)",
            (_X64, "--iree-llvmcpu-target-cpu=x86-64-v2"),
            ("-target", "x86_64-freestanding-none", "-mcpu=x86_64_v2"),
            "Nehalem-v2", unicorn=True),
    Profile("x86-64-v3", "x86_64", "x86-64-v3 (AVX2, FMA, BMI2)",
            (_X64, "--iree-llvmcpu-target-cpu=x86-64-v3"),
            ("-target", "x86_64-freestanding-none", "-mcpu=x86_64_v3"),
            "Haswell-v4"),
    Profile("armv8-a", "aarch64", "Armv8-A (NEON)",
            (_A64, "--iree-llvmcpu-target-cpu=generic"),
            ("-target", "aarch64-freestanding-none", "-mcpu=generic"),
            "cortex-a57", unicorn=True),
    Profile("armv8.2-a+dotprod", "aarch64", "Armv8.2-A with dot product",
            (_A64, "--iree-llvmcpu-target-cpu=generic",
             "--iree-llvmcpu-target-cpu-features=+v8.2a,+dotprod,+fullfp16"),
            ("-target", "aarch64-freestanding-none",
             "-mcpu=generic+v8_2a+dotprod+fullfp16"),
            "cortex-a76"),
    Profile("sve", "aarch64", "Armv8.2-A with SVE (any vector length)",
            (_A64, "--iree-llvmcpu-target-cpu=generic",
             "--iree-llvmcpu-target-cpu-features=+v8.2a,+sve"),
            ("-target", "aarch64-freestanding-none", "-mcpu=generic+v8_2a+sve"),
            "max,sve-max-vq={vq},sve-default-vector-length={vlenb}",
            vlens=_SVE_VLENS),
    Profile("sve2", "aarch64", "Armv9-A with SVE2 (any vector length)",
            (_A64, "--iree-llvmcpu-target-cpu=generic",
             "--iree-llvmcpu-target-cpu-features=+v9a,+sve2"),
            ("-target", "aarch64-freestanding-none", "-mcpu=generic+v9a+sve2"),
            "max,sve-max-vq={vq},sve-default-vector-length={vlenb}",
            vlens=_SVE_VLENS),
    Profile("rv64gc", "riscv64", "RV64GC",
            _RV64 + ("--iree-llvmcpu-target-cpu-features=+m,+a,+f,+d,+c",
                     "--iree-llvmcpu-target-abi=lp64d"),
            ("-target", "riscv64-freestanding-none", "-mcpu=generic_rv64+m+a+f+d+c"),
            "rv64,v=false", unicorn=True),
    Profile("rv64gcv", "riscv64", "RV64GCV (RVV 1.0, any VLEN)",
            _RV64 + ("--iree-llvmcpu-target-cpu-features=+m,+a,+f,+d,+c,+v",
                     "--iree-llvmcpu-target-abi=lp64d"),
            ("-target", "riscv64-freestanding-none",
             "-mcpu=generic_rv64+m+a+f+d+c+v"),
            "rv64,v=true,vlen={vlen},elen=64,vext_spec=v1.0", vlens=_RVV_VLENS),
    Profile("pentium4", "x86_32", "i686 with SSE2 (Pentium 4)",
            (_X86, "--iree-llvmcpu-target-cpu=pentium4"),
            ("-target", "x86-freestanding-none", "-mcpu=pentium4"),
            "pentium3,+sse2", unicorn=True),
    Profile("i686", "x86_32", "i686 (x87, no SSE required)",
            (_X86, "--iree-llvmcpu-target-cpu=generic"),
            ("-target", "x86-freestanding-none"),
            "pentium3", unicorn=True, note=_X87_NOTE),
    Profile("haswell", "x86_32", "Haswell (AVX2, FMA) in 32-bit mode",
            (_X86, "--iree-llvmcpu-target-cpu=haswell"),
            ("-target", "x86-freestanding-none", "-mcpu=haswell"),
            "Haswell-v4"),
    Profile("armv7-a+neon+vfp4+hwdiv", "arm32",
            "Armv7-A with NEON, VFPv4 and integer divide (Cortex-A15)",
            (_ARM, "--iree-llvmcpu-target-cpu=generic",
             "--iree-llvmcpu-target-cpu-features=+neon,+vfp4,+hwdiv-arm",
             "--iree-llvmcpu-target-float-abi=hard"),
            ("-target", "arm-freestanding-eabihf", "-mcpu=cortex_a15"),
            "cortex-a15", unicorn=True),
    Profile("armv7-a", "arm32", "generic Armv7-A with VFPv3 (no FMA, no divide)",
            (_ARM, "--iree-llvmcpu-target-cpu=generic",
             "--iree-llvmcpu-target-float-abi=hard"),
            ("-target", "arm-freestanding-eabihf", "-mcpu=generic+v7a+vfp3"),
            # (LLVM's generic Armv7-A code still uses the ARM-mode divide)
            "cortex-a15", unicorn=True,
            note="integer division leaves __aeabi_idiv undefined"),
    Profile("rv32imf", "riscv32", "RV32IMF",
            _RV32 + ("--iree-llvmcpu-target-cpu-features=+m,+f",
                     "--iree-llvmcpu-target-abi=ilp32"),
            ("-target", "riscv32-freestanding-none", "-mcpu=generic_rv32+m+f"),
            "rv32,d=false,v=false", unicorn=True),
    Profile("rv32imf+zve32f", "riscv32", "RV32IMF with Zve32f vectors (any VLEN)",
            # (+zvl128b: with Zve32f alone LLVM cannot lower exp's vectors)
            _RV32 + ("--iree-llvmcpu-target-cpu-features=+m,+f,+zve32f,+zvl128b",
                     "--iree-llvmcpu-target-abi=ilp32"),
            ("-target", "riscv32-freestanding-none",
             "-mcpu=generic_rv32+m+f+zve32f+zvl128b"),
            "rv32,d=false,Zve32f=true,vlen={vlen}", vlens=(128, 256, 512, 1024)),
)

#: The profile each architecture's plain name compiles for (its
#: ``ArchInfo.iree_flags`` and ``zig_flags``), from
#: :attr:`ArchInfo.default_profile`.
DEFAULT_PROFILES: dict[str, str] = {a.name: a.default_profile for a in TABLE
                                    if a.default_profile}

_PROFILES: dict[tuple[str, str], Profile] = {(p.arch, p.name): p for p in PROFILES}


def profiles(arch: str) -> tuple[Profile, ...]:
    """The profiles of architecture ``arch`` (name or alias), in table
    order."""
    name = lookup(arch).name
    return tuple(p for p in PROFILES if p.arch == name)


def profile(arch: str, name: str) -> Profile:
    """The profile ``name`` (any case) of architecture ``arch``.

    Raises:
        FatElfSelectError: unknown architecture or profile (field ``cpu``);
            the message lists the architecture's profiles.
    """
    info = lookup(arch)
    found = _PROFILES.get((info.name, str(name).strip().lower()))
    if found is None:
        known = ", ".join(p.name for p in profiles(info.name)) or "none"
        raise FatElfSelectError(f"unknown CPU profile {name!r} for {info.name}; "
                                f"known: {known}", field="cpu", value=name)
    return found


def host() -> ArchInfo | None:
    """The architecture the running interpreter executes, or None.

    ``platform.machine()`` picks the family; a 32-bit interpreter on a 64-bit
    kernel gets the 32-bit architecture of that family."""
    raw = platform.machine().lower()
    bits = struct.calcsize("P") * 8
    family = [a for a in TABLE if raw in a.host_names]
    if not family:
        return None
    for a in family:
        if a.elf_class == bits:
            return a
    name = family[0].narrow
    return _BY_NAME.get(name) if bits == 32 and name else None


def arch_name(machine: int, word_size: int, byte_order: str = "little") -> str:
    """Human name for a target: ``x86_64``, ``aarch64_be``, or
    ``machine<N>-<bits>`` for machines missing from :data:`TABLE`."""
    info = by_target(machine, word_size)
    base = info.name if info else f"machine{machine}-{word_size}"
    return base + ("_be" if byte_order == "big" else "")


def arch_target(name: str) -> tuple[int, int]:
    """Map an architecture name or alias to ``(e_machine, word size)``.

    Also accepts the ``machine<N>-<bits>`` fallback names produced by
    :func:`arch_name`.

    Raises:
        FatElfSelectError: unknown name; the message lists the known names.
    """
    key = str(name).strip().lower()
    if key.startswith("machine") and "-" in key:
        num, _, bits = key[len("machine"):].partition("-")
        if num.isdigit() and bits in ("32", "64") and int(num) <= 0xFFFF:
            return int(num), int(bits)
    return lookup(key).target


def parse_arch(name: str) -> tuple[int, int, str | None]:
    """Like :func:`arch_target` but also understands a ``_be``/``_le``
    suffix: returns ``(e_machine, word size, byte order or None)``."""
    key = str(name).strip().lower()
    for suffix, order in (("_be", "big"), ("_le", "little")):
        if key.endswith(suffix) and key not in _BY_NAME:
            machine, word_size = arch_target(key[: -len(suffix)])
            return machine, word_size, order
    machine, word_size = arch_target(key)
    return machine, word_size, None


def host_arch() -> str:
    """Name of the running interpreter's architecture.

    Raises:
        FatElfSelectError: the host is not in :data:`TABLE`.
    """
    info = host()
    if info is None:
        raise FatElfSelectError(
            f"unknown host machine {platform.machine()!r}; pass an architecture "
            f"explicitly (known: {known_names()})", field="host",
            value=platform.machine())
    return info.name


def osabi_name(osabi: int) -> str:
    """Short OSABI name, or ``osabi<N>`` when unknown."""
    return OSABI_NAMES.get(osabi, f"osabi{osabi}")


def machine_name(machine: int) -> str:
    """``EM_*`` constant name, or ``unknown``."""
    return MACHINE_NAMES.get(machine, "unknown")
