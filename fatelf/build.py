"""Writing FatELF bundles: join, remove, replace.

Output layout (FatELF specification v1, icculus/fatelf
docs/fatelf-specification.txt): the 8-byte header, the 24-byte records, then
each ELF image at the next multiple of 4096 after the end of the previous
data, with zero bytes as padding in between.  Nothing follows the last image
except, for ``remove``/``replace``, any trailing bytes the input bundle
already carried (the reference tools keep those too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace as _with

from .elf import field_path
from .errors import FatElfInputError
from .format import (
    DEFAULT_NAME,
    HEADER,
    MAGIC,
    MAX_RECORDS,
    PAGE_SIZE,
    VERSION,
    FatElf,
    Record,
    RecordRef,
    align_up,
    table_size,
)


def pack(entries: Sequence[tuple[Record, bytes]], trailer: bytes = b"") -> bytes:
    """Lay out ``entries`` in the given order (offsets and sizes of the given
    records are ignored and recomputed) and append ``trailer``.

    Raises:
        FatElfInputError: fewer than 1 or more than 255 entries (field
            ``header.record_count``).
    """
    if not 1 <= len(entries) <= MAX_RECORDS:
        raise FatElfInputError(f"{len(entries)} ELFs; a FatELF holds 1 to {MAX_RECORDS}",
                               name=DEFAULT_NAME, field="header.record_count",
                               value=len(entries))
    offset = table_size(len(entries))
    records, body = [], bytearray()
    for rec, elf in entries:
        start = align_up(offset, PAGE_SIZE)
        body += bytes(start - offset) + elf
        records.append(_with(rec, offset=start, size=len(elf)))
        offset = start + len(elf)
    header = HEADER.pack(magic=MAGIC, version=VERSION, record_count=len(records), reserved=0)
    return header + b"".join(r.pack() for r in records) + bytes(body) + bytes(trailer)


def join(elfs: Sequence[bytes], names: Sequence[str] | None = None) -> bytes:
    """Build a bundle from ELF images.

    Each record is derived from its ELF's header.  Errors about ``elfs[i]``
    carry ``names[i]`` as their name or, without ``names``, ``<memory>`` and
    a field starting ``elf[i]``.  Records are sorted by (machine, word size,
    byte order, OSABI, OSABI version) so the output does not depend on the
    input order.

    Raises:
        FatElfInputError: a non-ELF input (see :func:`fatelf.elf.elf_target`),
            an empty list (field ``elfs``), more than 255 inputs, two inputs
            for the same target (field ``target``), or as many names as ELFs
            not given (field ``names``).
    """
    elfs = [bytes(e) for e in elfs]
    if names is not None and len(names) != len(elfs):
        raise FatElfInputError(f"{len(names)} names for {len(elfs)} ELFs", name=DEFAULT_NAME,
                               field="names", value=len(names))
    if not elfs:
        raise FatElfInputError("no ELF files given", name=DEFAULT_NAME, field="elfs",
                               value=0)
    if names is None:
        where = [(DEFAULT_NAME, f"elf[{i}]") for i in range(len(elfs))]
    else:
        where = [(name, "") for name in names]
    seen: dict[tuple, str] = {}
    entries = []
    for elf, (name, field) in zip(elfs, where):
        rec = Record.from_elf(elf, name, field=field)
        label = field or name
        if rec.target in seen:
            raise FatElfInputError(f"same target as {seen[rec.target]}: {rec.describe()}",
                                   name=name, field=field_path(field, "target"),
                                   value=rec.target)
        seen[rec.target] = label
        entries.append((rec, elf))
    entries.sort(key=lambda e: e[0].sort_key)
    return pack(entries)


def remove(data, record: RecordRef, name: str = DEFAULT_NAME) -> bytes:
    """The bundle ``data`` without one record (index or :class:`Record`);
    the remaining records keep their order.

    Raises:
        FatElfFormatError: ``data`` is not a valid FatELF.
        FatElfSelectError: no such record.
        FatElfInputError: it is the only record (a FatELF holds at least one
            ELF; field ``record <N>``).
    """
    fat = FatElf.parse(data, name)
    idx = fat.index(record)
    if len(fat.records) == 1:
        arch = fat.records[idx].arch
        raise FatElfInputError(f"cannot remove {arch}, it is the only record and a FatELF "
                               f"needs at least one", name=name, field=f"record {idx}",
                               value=arch)
    entries = [e for i, e in enumerate(fat.split()) if i != idx]
    return pack(entries, fat.trailer)


def replace(data, elf: bytes, name: str = DEFAULT_NAME, elf_name: str = "<elf>") -> bytes:
    """The bundle ``data`` with the record for ``elf``'s target holding
    ``elf`` instead.

    Raises:
        FatElfFormatError: ``data`` is not a valid FatELF.
        FatElfInputError: ``elf`` is not a usable ELF, or the bundle has no
            record for its target (name ``elf_name``, field ``target``).
    """
    fat = FatElf.parse(data, name)
    elf = bytes(elf)
    new = Record.from_elf(elf, elf_name)
    for i, rec in enumerate(fat.records):
        if rec.target == new.target:
            entries = fat.split()
            entries[i] = (rec, elf)
            return pack(entries, fat.trailer)
    raise FatElfInputError(f"no record of {name} has its target {new.describe()}; the "
                           f"bundle holds: {', '.join(fat.arches)}", name=elf_name,
                           field="target", value=new.target)
