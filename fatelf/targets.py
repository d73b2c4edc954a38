"""Naming individual records of a bundle, as the reference tools do.

icculus/fatelf's fatelf-extract/-remove/-verify take a *target* string that
is either ``record<N>`` (table index) or ``:``-separated fields, any subset of
machine, word size, byte order, OSABI and OSABI version.  Here a target is:

* ``record<N>``  - record N of the table;
* ``ARCH[:QUALIFIER...]`` - ARCH is any name :func:`fatelf.arches.arch_target`
  knows (``x86_64``, ``arm64``, ``aarch64_be``, ``machine99-32``...), and the
  optional qualifiers narrow the match: ``le``/``be`` (also ``littleendian``/
  ``bigendian``), ``32bit``/``64bit``, an OSABI name (``none``/``sysv``,
  ``linux``, ``standalone``, ... or ``osabi<N>``) and ``osabiver<N>``.

Unlike :meth:`FatElf.find`, no OSABI filter applies unless one is given, and
a target that matches more than one record is an error.
"""

from __future__ import annotations

from .arches import OSABI_NAMES, osabi_name, parse_arch
from .errors import FatElfSelectError
from .format import FatElf

_OSABI_BY_NAME = {v: k for k, v in OSABI_NAMES.items()}
_OSABI_BY_NAME["sysv"] = 0
_ORDERS = {"le": "little", "littleendian": "little", "little": "little",
           "be": "big", "bigendian": "big", "big": "big"}
_WORDS = {"32bit": 32, "32bits": 32, "64bit": 64, "64bits": 64}


def _parse(spec: str, name: str) -> dict:
    fields: dict = {}
    parts = [p for p in spec.strip().lower().split(":") if p]
    if not parts:
        raise FatElfSelectError("empty target", name=name, field="target", value=spec)
    try:
        machine, word_size, order = parse_arch(parts[0])
    except FatElfSelectError as e:
        raise e.with_name(name) from None
    fields.update(machine=machine, word_size=word_size)
    if order:
        fields["byte_order"] = order
    for part in parts[1:]:
        if part in _ORDERS:
            fields["byte_order"] = _ORDERS[part]
        elif part in _WORDS:
            fields["word_size"] = _WORDS[part]
        elif part in _OSABI_BY_NAME:
            fields["osabi"] = _OSABI_BY_NAME[part]
        elif part.startswith("osabiver") and part[8:].isdigit():
            fields["osabi_version"] = int(part[8:])
        elif part.startswith("osabi") and part[5:].isdigit():
            fields["osabi"] = int(part[5:])
        else:
            raise FatElfSelectError(f"unknown qualifier {part!r} in {spec!r} (use le, be, "
                                    f"32bit, 64bit, an OSABI name or osabiver<N>)",
                                    name=name, field="target", value=spec)
    return fields


def matching_indices(fat: FatElf, spec: str) -> list[int]:
    """Indices of every record the target ``spec`` matches.

    Raises:
        FatElfSelectError: ``spec`` is empty, names an unknown architecture
            (field ``arch``) or qualifier (field ``target``), or is
            ``record<N>`` for a record the bundle lacks (field ``record``).
    """
    s = spec.strip().lower()
    if s.startswith("record") and s[6:].isdigit():
        return [fat.index(int(s[6:]))]
    fields = _parse(spec, fat.name)
    return [i for i, rec in enumerate(fat.records)
            if all(getattr(rec, k) == v for k, v in fields.items())]


def resolve(fat: FatElf, spec: str) -> int:
    """Index of the single record ``spec`` names.

    Raises:
        FatElfSelectError: ``spec`` names no record or several (field
            ``target``, value ``spec``), or is invalid (see
            :func:`matching_indices`).
    """
    found = matching_indices(fat, spec)
    if len(found) == 1:
        return found[0]
    if not found:
        raise FatElfSelectError(f"no record matches {spec!r}; the bundle holds: "
                                f"{', '.join(target_names(fat))}", name=fat.name,
                                field="target", value=spec)
    raise FatElfSelectError(f"{spec!r} is ambiguous, it matches records "
                            f"{', '.join(map(str, found))} "
                            f"({', '.join(target_names(fat)[i] for i in found)})",
                            name=fat.name, field="target", value=spec)


def target_names(fat: FatElf) -> list[str]:
    """Shortest unambiguous target for each record: the arch name when it is
    unique in the bundle, else ``arch:<osabi>:osabiver<N>``."""
    arches = fat.arches
    names = []
    for rec in fat.records:
        if arches.count(rec.arch) == 1:
            names.append(rec.arch)
        else:
            names.append(f"{rec.arch}:{osabi_name(rec.osabi)}:osabiver{rec.osabi_version}")
    return names
