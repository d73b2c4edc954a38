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

from .errors import FatElfInputError
from .format import (DEFAULT_NAME, HEADER, MAGIC, MAX_RECORDS, PAGE_SIZE, VERSION,
                     FatElf, Record, RecordRef, align_up, table_size)


def pack(entries: Sequence[tuple[Record, bytes]], trailer: bytes = b"") -> bytes:
    """Lay out ``entries`` in the given order (offsets and sizes of the given
    records are ignored and recomputed) and append ``trailer``."""
    if not 1 <= len(entries) <= MAX_RECORDS:
        raise FatElfInputError(f"a FatELF holds 1 to {MAX_RECORDS} ELFs, got {len(entries)}")
    offset = table_size(len(entries))
    records, body = [], bytearray()
    for rec, elf in entries:
        start = align_up(offset, PAGE_SIZE)
        body += bytes(start - offset) + elf
        records.append(_with(rec, offset=start, size=len(elf)))
        offset = start + len(elf)
    header = HEADER.pack(MAGIC, VERSION, len(records), 0)
    return header + b"".join(r.pack() for r in records) + bytes(body) + bytes(trailer)


def join(elfs: Sequence[bytes], names: Sequence[str] | None = None) -> bytes:
    """Build a bundle from ELF images.

    Each record is derived from its ELF's header (``names[i]``, default
    ``elf[i]``, labels errors).  Records are sorted by (machine, word size,
    byte order, OSABI, OSABI version) so the output does not depend on the
    input order.  Raises :class:`FatElfInputError` for a non-ELF input, an
    empty list, more than 255 inputs or two inputs for the same target.
    """
    elfs = [bytes(e) for e in elfs]
    names = list(names) if names is not None else [f"elf[{i}]" for i in range(len(elfs))]
    if len(names) != len(elfs):
        raise FatElfInputError(f"join: {len(elfs)} ELFs but {len(names)} names")
    if not elfs:
        raise FatElfInputError("join: no ELF files given")
    seen: dict[tuple, str] = {}
    entries = []
    for elf, name in zip(elfs, names):
        rec = Record.from_elf(elf, name)
        if rec.target in seen:
            raise FatElfInputError(f"{name}: same target as {seen[rec.target]}: "
                                   f"{rec.describe()}")
        seen[rec.target] = name
        entries.append((rec, elf))
    entries.sort(key=lambda e: e[0].sort_key)
    return pack(entries)


def remove(data, record: RecordRef, name: str = DEFAULT_NAME) -> bytes:
    """The bundle ``data`` without one record (index or :class:`Record`);
    the remaining records keep their order.  Removing the only record is an
    error, since a FatELF must hold at least one ELF."""
    fat = FatElf.parse(data, name)
    idx = fat.index(record)
    if len(fat.records) == 1:
        raise FatElfInputError(f"{name}: record {idx}: cannot remove {fat.records[idx].arch}, "
                               f"it is the only record and a FatELF needs at least one")
    entries = [e for i, e in enumerate(fat.split()) if i != idx]
    return pack(entries, fat.trailer)


def replace(data, elf: bytes, name: str = DEFAULT_NAME, elf_name: str = "<elf>") -> bytes:
    """The bundle ``data`` with the record for ``elf``'s target holding
    ``elf`` instead; an ELF for a target the bundle lacks is an error."""
    fat = FatElf.parse(data, name)
    elf = bytes(elf)
    new = Record.from_elf(elf, elf_name)
    for i, rec in enumerate(fat.records):
        if rec.target == new.target:
            entries = fat.split()
            entries[i] = (rec, elf)
            return pack(entries, fat.trailer)
    raise FatElfInputError(f"{elf_name}: no record of {name} has its target "
                           f"{new.describe()}; the bundle holds: {', '.join(fat.arches)}")
