"""Architecture names, ELF machine numbers and OSABI names.

Machine numbers are the ELF ``e_machine`` values and OSABI numbers the
``e_ident[EI_OSABI]`` values of the System V gABI ("ELF header", ch. 4).

An architecture name stands for an (e_machine, word size) pair, e.g.
``x86_64`` is (62, 64) and ``riscv32`` is (243, 32).  Records whose ELF is
big-endian get a ``_be`` suffix (``aarch64_be``); :func:`parse_arch` accepts
that suffix (and ``_le``) and turns it into a byte order.
"""

from __future__ import annotations

import platform
import struct
import sys

from .errors import FatElfSelectError

#: Canonical architecture name -> (e_machine, word size in bits).
ARCHES: dict[str, tuple[int, int]] = {
    "x86_64": (62, 64),
    "aarch64": (183, 64),
    "riscv64": (243, 64),
    "x86_32": (3, 32),
    "arm32": (40, 32),
    "riscv32": (243, 32),
    "ppc32": (20, 32),
    "ppc64": (21, 64),
    "mips32": (8, 32),
    "mips64": (8, 64),
    "s390x": (22, 64),
    "loongarch64": (258, 64),
}

#: Other spellings accepted by :func:`arch_target` -> canonical name.
ALIASES: dict[str, str] = {
    "amd64": "x86_64",
    "x64": "x86_64",
    "x86-64": "x86_64",
    "arm64": "aarch64",
    "rv64": "riscv64",
    "x86": "x86_32",
    "i386": "x86_32",
    "i486": "x86_32",
    "i586": "x86_32",
    "i686": "x86_32",
    "ia32": "x86_32",
    "arm": "arm32",
    "armv7": "arm32",
    "armv7l": "arm32",
    "armv7a": "arm32",
    "armv6l": "arm32",
    "armv8l": "arm32",
    "armhf": "arm32",
    "rv32": "riscv32",
    "ppc": "ppc32",
    "powerpc": "ppc32",
    "ppc64le": "ppc64",
    "powerpc64": "ppc64",
    "powerpc64le": "ppc64",
    "mips": "mips32",
    "mipsel": "mips32",
    "mips64el": "mips64",
    "loong64": "loongarch64",
}

#: e_machine -> symbolic constant name (used by ``dump`` and ``info``).
MACHINE_NAMES: dict[int, str] = {
    0: "EM_NONE",
    3: "EM_386",
    8: "EM_MIPS",
    20: "EM_PPC",
    21: "EM_PPC64",
    22: "EM_S390",
    40: "EM_ARM",
    62: "EM_X86_64",
    183: "EM_AARCH64",
    243: "EM_RISCV",
    258: "EM_LOONGARCH",
}

#: e_ident[EI_OSABI] -> short name (gABI table; 0 is ELFOSABI_NONE/SYSV).
OSABI_NAMES: dict[int, str] = {
    0: "none",
    1: "hpux",
    2: "netbsd",
    3: "linux",
    4: "hurd",
    6: "solaris",
    7: "aix",
    8: "irix",
    9: "freebsd",
    10: "tru64",
    11: "modesto",
    12: "openbsd",
    13: "openvms",
    14: "nsk",
    15: "aros",
    16: "fenixos",
    17: "cloudabi",
    18: "openvos",
    97: "armabi",
    255: "standalone",
}

#: OSABI values a runtime loader accepts when selecting a record: the ELF
#: must either claim no OS, Linux, or be standalone (the IREE runtime's rule).
RUNTIME_OSABIS: frozenset[int] = frozenset({0, 3, 255})

_REVERSE: dict[tuple[int, int], str] = {v: k for k, v in ARCHES.items()}


def _known_names() -> str:
    return ", ".join(sorted(ARCHES)) + " (aliases: " + ", ".join(sorted(ALIASES)) + ")"


def arch_name(machine: int, word_size: int, byte_order: str = "little") -> str:
    """Human name for a target: ``x86_64``, ``aarch64_be``, or
    ``machine<N>-<bits>`` for machines missing from :data:`ARCHES`."""
    base = _REVERSE.get((machine, word_size), f"machine{machine}-{word_size}")
    return base + ("_be" if byte_order == "big" else "")


def arch_target(name: str) -> tuple[int, int]:
    """Map an architecture name or alias to ``(e_machine, word size)``.

    Also accepts the ``machine<N>-<bits>`` fallback names produced by
    :func:`arch_name`.  Unknown names raise :class:`FatElfSelectError`
    listing the known names.
    """
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key in ARCHES:
        return ARCHES[key]
    if key.startswith("machine") and "-" in key:
        num, _, bits = key[len("machine"):].partition("-")
        if num.isdigit() and bits in ("32", "64") and int(num) <= 0xFFFF:
            return int(num), int(bits)
    raise FatElfSelectError(f"unknown architecture {name!r}; known: {_known_names()}")


def parse_arch(name: str) -> tuple[int, int, str | None]:
    """Like :func:`arch_target` but also understands a ``_be``/``_le``
    suffix: returns ``(e_machine, word size, byte order or None)``."""
    key = str(name).strip().lower()
    for suffix, order in (("_be", "big"), ("_le", "little")):
        if key.endswith(suffix) and key not in ARCHES and key not in ALIASES:
            machine, word_size = arch_target(key[: -len(suffix)])
            return machine, word_size, order
    machine, word_size = arch_target(key)
    return machine, word_size, None


_HOST_MACHINES = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
    "riscv64": "riscv64",
    "riscv32": "riscv32",
    "ppc64": "ppc64",
    "ppc64le": "ppc64",
    "s390x": "s390x",
    "loongarch64": "loongarch64",
    "mips64": "mips64",
    "mips": "mips32",
}
_NARROW = {"x86_64": "x86_32", "aarch64": "arm32", "riscv64": "riscv32",
           "ppc64": "ppc32", "mips64": "mips32"}


def host_arch() -> str:
    """Architecture name of the running interpreter (``platform.machine()``
    mapped onto :data:`ARCHES`; a 32-bit interpreter on a 64-bit kernel gets
    the 32-bit name)."""
    raw = platform.machine().lower()
    name = _HOST_MACHINES.get(raw)
    if name is None:
        if raw in ("i386", "i486", "i586", "i686", "x86"):
            name = "x86_32"
        elif raw.startswith("arm"):
            name = "arm32"
        else:
            raise FatElfSelectError(
                f"unknown host machine {raw!r}; pass an architecture explicitly "
                f"(known: {_known_names()})")
    if struct.calcsize("P") == 4:
        name = _NARROW.get(name, name)
    return name


def host_byte_order() -> str:
    """``'little'`` or ``'big'`` for the running interpreter."""
    return sys.byteorder


def osabi_name(osabi: int) -> str:
    """Short OSABI name, or ``osabi<N>`` when unknown."""
    return OSABI_NAMES.get(osabi, f"osabi{osabi}")


def machine_name(machine: int) -> str:
    """``EM_*`` constant name, or ``unknown``."""
    return MACHINE_NAMES.get(machine, "unknown")
