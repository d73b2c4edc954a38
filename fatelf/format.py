"""FatELF v1 layout, parsing, validation and selection.

Layout (FatELF specification v1, icculus/fatelf docs/fatelf-specification.txt;
the C structs are in include/fatelf.h of the same repository).  Every field is
little endian regardless of the contained ELFs::

    header, 8 bytes at offset 0
      0  u32  magic          0x1F0E70FA (bytes FA 70 0E 1F)
      4  u16  version        1 (the only version defined)
      6  u8   record_count   number of records that follow
      7  u8   reserved       must be 0

    record_count records of 24 bytes each, starting at offset 8
      0  u16  machine        ELF e_machine
      2  u8   osabi          ELF e_ident[EI_OSABI]
      3  u8   osabi_version  ELF e_ident[EI_ABIVERSION]
      4  u8   word_size      1 = 32-bit, 2 = 64-bit (same codes as EI_CLASS)
      5  u8   byte_order     0 = big endian (MSB), 1 = little endian (LSB)
                             (NOT the EI_DATA codes, which are 2 and 1)
      6  u8   reserved0      must be 0
      7  u8   reserved1      must be 0
      8  u64  offset         file offset of the ELF image
     16  u64  size           size of the ELF image in bytes

The ELF images follow the table, each at an offset aligned for its platform
(4096 in practice, as the reference tools assume), padded with zero bytes.
Records must not overlap one another, two records must not describe the same
target, and a reader must check every record against the real header of the
ELF it points to.  Bytes after the last image are allowed (the reference tools
call them "junk" and carry them along); :attr:`FatElf.trailer` exposes them.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import NamedTuple, Union

from .arches import RUNTIME_OSABIS, arch_name, host_arch, osabi_name, parse_arch
from .cstruct import CStruct
from .elf import ELF_CLASSES, ELF_DATAS, elf_target
from .errors import FatElfError, FatElfFormatError, FatElfInputError, FatElfSelectError
from .files import read_regular

MAGIC = 0x1F0E70FA
VERSION = 1
PAGE_SIZE = 4096
MAX_RECORDS = 255

#: The 8-byte header (the header struct of include/fatelf.h).
FATELF_HEADER = CStruct("fatelf_header", [
    ("magic", "u32"),
    ("version", "u16"),
    ("record_count", "u8"),
    ("reserved", "u8"),
], "FatELF specification v1 (icculus/fatelf include/fatelf.h)")

#: One 24-byte record (the record struct of include/fatelf.h).
FATELF_RECORD = CStruct("fatelf_record", [
    ("machine", "u16"),
    ("osabi", "u8"),
    ("osabi_version", "u8"),
    ("word_size", "u8"),
    ("byte_order", "u8"),
    ("reserved0", "u8"),
    ("reserved1", "u8"),
    ("offset", "u64"),
    ("size", "u64"),
], "FatELF specification v1 (icculus/fatelf include/fatelf.h)")

HEADER = FATELF_HEADER.layout()
RECORD = FATELF_RECORD.layout()
HEADER_SIZE = HEADER.size  # 8
RECORD_SIZE = RECORD.size  # 24

#: record word_size code <-> bits (the EI_CLASS codes)
WORD_SIZE_CODES = dict(ELF_CLASSES)
WORD_SIZE_FROM_BITS = {bits: code for code, bits in WORD_SIZE_CODES.items()}
#: record byte_order code <-> name
BYTE_ORDER_CODES = {0: "big", 1: "little"}
BYTE_ORDER_FROM_NAME = {"big": 0, "little": 1}
#: ELF EI_DATA code for a byte order (differs from the record code!)
EI_DATA_FROM_NAME = {order: code for code, order in ELF_DATAS.items()}

DEFAULT_NAME = "<memory>"


def table_size(count: int) -> int:
    """Bytes taken by the header plus ``count`` records."""
    return HEADER_SIZE + RECORD_SIZE * count


def align_up(value: int, alignment: int = PAGE_SIZE) -> int:
    """``value`` rounded up to a multiple of ``alignment``."""
    return -(-value // alignment) * alignment


def is_fatelf(data) -> bool:
    """True when ``data`` starts with the FatELF magic (just the magic)."""
    return len(data) >= 4 and int.from_bytes(bytes(data[:4]), "little") == MAGIC


@dataclass(frozen=True)
class Record:
    """One entry of the record table, in friendly units.

    ``word_size`` is in bits (32 or 64) and ``byte_order`` is ``'little'`` or
    ``'big'``; :meth:`pack` converts them to the on-disk codes.

    Raises:
        FatElfError: a field is out of range (name ``Record``, field the
            field's name).
    """

    machine: int
    osabi: int
    osabi_version: int
    word_size: int
    byte_order: str
    offset: int = 0
    size: int = 0

    def __post_init__(self):
        checks = (
            ("machine", 0 <= self.machine <= 0xFFFF),
            ("osabi", 0 <= self.osabi <= 0xFF),
            ("osabi_version", 0 <= self.osabi_version <= 0xFF),
            ("word_size", self.word_size in WORD_SIZE_FROM_BITS),
            ("byte_order", self.byte_order in BYTE_ORDER_FROM_NAME),
            ("offset", 0 <= self.offset < 1 << 64),
            ("size", 0 <= self.size < 1 << 64),
        )
        for field, ok in checks:
            if not ok:
                value = getattr(self, field)
                raise FatElfError(f"invalid value {value!r}", name="Record", field=field,
                                  value=value)

    @property
    def target(self) -> tuple[int, int, int, int, str]:
        """(machine, osabi, osabi_version, word_size, byte_order)."""
        return (self.machine, self.osabi, self.osabi_version, self.word_size, self.byte_order)

    @property
    def arch(self) -> str:
        """Architecture name, e.g. ``x86_64`` (see :func:`fatelf.arches.arch_name`)."""
        return arch_name(self.machine, self.word_size, self.byte_order)

    @property
    def end(self) -> int:
        """Offset just past the ELF image."""
        return self.offset + self.size

    @property
    def sort_key(self) -> tuple[int, int, int, int, int]:
        """Order used by ``join``: machine, word size, byte order, OSABI,
        OSABI version (the field precedence of icculus' fatelf-split)."""
        return (self.machine, self.word_size, BYTE_ORDER_FROM_NAME[self.byte_order],
                self.osabi, self.osabi_version)

    def describe(self) -> str:
        """The target in words, for messages."""
        return (f"{self.arch} (machine {self.machine}, {self.word_size}-bit, "
                f"{self.byte_order}-endian, OSABI {self.osabi} {osabi_name(self.osabi)}, "
                f"version {self.osabi_version})")

    def pack(self) -> bytes:
        """The 24 on-disk bytes of this record."""
        return RECORD.pack(machine=self.machine, osabi=self.osabi,
                           osabi_version=self.osabi_version,
                           word_size=WORD_SIZE_FROM_BITS[self.word_size],
                           byte_order=BYTE_ORDER_FROM_NAME[self.byte_order],
                           offset=self.offset, size=self.size)

    @classmethod
    def from_elf(cls, elf, name: str = DEFAULT_NAME, offset: int = 0, *,
                 field: str = "") -> "Record":
        """Record describing the ELF image ``elf`` (size = its length).

        ``name`` and ``field`` (e.g. ``elf[2]``) say where ``elf`` comes from.

        Raises:
            FatElfInputError: ``elf`` is not a usable ELF (see
                :func:`fatelf.elf.elf_target`).
        """
        t = elf_target(elf, name, FatElfInputError, field=field)
        return cls(t.machine, t.osabi, t.osabi_version, t.word_size, t.byte_order,
                   offset, len(elf))


class RawRecord(NamedTuple):
    """A record exactly as stored (codes, not friendly units)."""

    machine: int
    osabi: int
    osabi_version: int
    word_size: int
    byte_order: int
    reserved0: int
    reserved1: int
    offset: int
    size: int


class RawHeader(NamedTuple):
    """The header exactly as stored, with its records."""

    magic: int
    version: int
    record_count: int
    reserved: int
    records: tuple[RawRecord, ...]


def read_table(data, name: str = DEFAULT_NAME) -> RawHeader:
    """Decode header and record table without judging their contents.

    Only checks what is needed to decode them: the magic, version 1 and that
    the table fits in ``data``.

    Raises:
        FatElfFormatError: ``data`` is shorter than the header (field
            ``header``), has another magic (``header.magic``) or version
            (``header.version``), or ends inside the record table
            (``header.record_count``).
    """
    n = len(data)
    if n < HEADER_SIZE:
        raise FatElfFormatError(f"file is {n} bytes, shorter than the {HEADER_SIZE}-byte "
                                f"FatELF header", name=name, field="header", value=n)
    head = HEADER.unpack(data, 0)
    magic, version, count = head["magic"], head["version"], head["record_count"]
    if magic != MAGIC:
        raise FatElfFormatError(f"{magic:#010x} is not the FatELF magic {MAGIC:#010x}",
                                name=name, field="header.magic", value=magic)
    if version != VERSION:
        raise FatElfFormatError(f"{version} is not supported (only version {VERSION} is "
                                f"defined)", name=name, field="header.version", value=version)
    need = table_size(count)
    if n < need:
        raise FatElfFormatError(f"{count} needs a {need:#x}-byte header and record table "
                                f"but the file has {n:#x} bytes", name=name,
                                field="header.record_count", value=count)
    records = tuple(RawRecord(**r) for r in RECORD.unpack_array(data, HEADER_SIZE, count))
    return RawHeader(records=records, **head)


def _check_record(name: str, i: int, raw: RawRecord, file_size: int,
                  table_end: int, alignment: int) -> Record:
    def error(field, message, value):
        return FatElfFormatError(message, name=name, field=f"record {i}.{field}", value=value)

    if raw.reserved0 or raw.reserved1:
        field = "reserved0" if raw.reserved0 else "reserved1"
        value = getattr(raw, field)
        raise error(field, f"{value:#04x} is not zero", value)
    if raw.word_size not in WORD_SIZE_CODES:
        raise error("word_size", f"{raw.word_size} is neither 1 (32-bit) nor 2 (64-bit)",
                    raw.word_size)
    if raw.byte_order not in BYTE_ORDER_CODES:
        raise error("byte_order", f"{raw.byte_order} is neither 0 (big endian) nor "
                    f"1 (little endian)", raw.byte_order)
    if raw.size == 0:
        raise error("size", f"0 at offset {raw.offset:#x} holds no ELF", 0)
    if raw.offset < table_end:
        raise error("offset", f"{raw.offset:#x} lies inside the header and record table "
                    f"(which end at {table_end:#x})", raw.offset)
    if raw.offset + raw.size > file_size:
        if raw.offset >= file_size:
            raise error("offset", f"{raw.offset:#x} + size {raw.size:#x} lies outside the "
                        f"file ({file_size:#x} bytes)", raw.offset)
        raise error("size", f"{raw.size:#x} at offset {raw.offset:#x} lies outside the "
                    f"file ({file_size:#x} bytes)", raw.size)
    if raw.offset % alignment:
        raise error("offset", f"{raw.offset:#x} is not aligned to {alignment:#x} bytes",
                    raw.offset)
    bits = WORD_SIZE_CODES[raw.word_size]
    if bits == 32 and raw.offset + raw.size > 0xFFFFFFFF:
        raise error("size", f"{raw.size:#x} at offset {raw.offset:#x} ends past 4 GiB, "
                    f"beyond a 32-bit ELF's reach", raw.size)
    return Record(raw.machine, raw.osabi, raw.osabi_version, bits,
                  BYTE_ORDER_CODES[raw.byte_order], raw.offset, raw.size)


def _check_payload(name: str, i: int, rec: Record, payload: bytes | memoryview) -> None:
    t = elf_target(payload, name, FatElfFormatError, field=f"record {i}.payload")
    ws = WORD_SIZE_FROM_BITS
    bo = BYTE_ORDER_FROM_NAME
    mismatches = (
        ("word_size", rec.word_size != t.word_size, ws[rec.word_size],
         f"{ws[rec.word_size]} ({rec.word_size}-bit)", "EI_CLASS",
         f"{ws[t.word_size]} ({t.word_size}-bit)"),
        ("byte_order", rec.byte_order != t.byte_order, bo[rec.byte_order],
         f"{bo[rec.byte_order]} ({rec.byte_order} endian)", "EI_DATA",
         f"{EI_DATA_FROM_NAME[t.byte_order]} ({t.byte_order} endian)"),
        ("machine", rec.machine != t.machine, rec.machine, str(rec.machine), "e_machine",
         str(t.machine)),
        ("osabi", rec.osabi != t.osabi, rec.osabi, str(rec.osabi), "EI_OSABI", str(t.osabi)),
        ("osabi_version", rec.osabi_version != t.osabi_version, rec.osabi_version,
         str(rec.osabi_version), "EI_ABIVERSION", str(t.osabi_version)),
    )
    for field, bad, value, mine, elf_field, theirs in mismatches:
        if bad:
            raise FatElfFormatError(f"{mine} disagrees with the ELF header's {elf_field} "
                                    f"{theirs}", name=name, field=f"record {i}.{field}",
                                    value=value)


RecordRef = Union[int, Record]


class FatElf:
    """A parsed, fully validated FatELF bundle.

    ``records`` lists the records in table order; ``data`` is the whole file
    and ``name`` the label used in error messages.
    """

    def __init__(self, data: bytes, records: list[Record], name: str = DEFAULT_NAME):
        self.data = data
        self.records = records
        self.name = name

    def __repr__(self) -> str:
        return f"FatElf(name={self.name!r}, arches={self.arches!r})"

    def __len__(self) -> int:
        return len(self.records)

    @classmethod
    def parse(cls, data, name: str = DEFAULT_NAME, *, alignment: int = PAGE_SIZE) -> "FatElf":
        """Parse and validate ``data`` (bytes-like).

        Checks: magic, version 1, reserved byte 0, at least one record, the
        record table inside the file, every record's reserved bytes, codes,
        non-zero size, placement after the table and inside the file,
        ``alignment`` of its offset (pass 1 to disable), no overlap between
        records, no two records for one target, and that each payload is an
        ELF whose header agrees with its record (``e_machine`` is read in the
        payload's own byte order).

        Raises:
            FatElfFormatError: the first check that fails; ``name`` is
                ``name``, ``field`` the header or record field (``header.magic``,
                ``record 2.offset``, ``record 1.payload.e_ident[EI_CLASS]``...)
                and ``value`` the value found there.
        """
        if not isinstance(data, (bytes, mmap.mmap)):
            data = bytes(data)      # (a file's map is parsed where it is)
        raw = read_table(data, name)
        if raw.reserved:
            raise FatElfFormatError(f"{raw.reserved:#04x} is not zero", name=name,
                                    field="header.reserved", value=raw.reserved)
        if raw.record_count == 0:
            raise FatElfFormatError("0 records; a FatELF holds at least one ELF", name=name,
                                    field="header.record_count", value=0)
        table_end = table_size(raw.record_count)
        records = [_check_record(name, i, r, len(data), table_end, alignment)
                   for i, r in enumerate(raw.records)]
        order = sorted(range(len(records)), key=lambda i: (records[i].offset, i))
        for a, b in zip(order, order[1:]):
            ra, rb = records[a], records[b]
            if ra.end > rb.offset:
                first, second = min(a, b), max(a, b)
                r1, r2 = records[first], records[second]
                raise FatElfFormatError(
                    f"{r2.offset:#x} + size {r2.size:#x} overlaps record {first} "
                    f"(offset {r1.offset:#x} + size {r1.size:#x})", name=name,
                    field=f"record {second}.offset", value=r2.offset)
        seen: dict[tuple, int] = {}
        for i, rec in enumerate(records):
            if rec.target in seen:
                raise FatElfFormatError(
                    f"target {rec.describe()} duplicates record {seen[rec.target]}",
                    name=name, field=f"record {i}", value=rec.target)
            seen[rec.target] = i
        with memoryview(data) as whole:
            for i, rec in enumerate(records):
                # (a view: a record's bytes are not copied to check its header)
                payload = whole[rec.offset:rec.end]
                try:
                    _check_payload(name, i, rec, payload)
                finally:
                    payload.release()
        return cls(data, records, name)

    # -- access ---------------------------------------------------------------

    @property
    def arches(self) -> list[str]:
        """Architecture names of the records, in table order."""
        return [r.arch for r in self.records]

    @property
    def payload_end(self) -> int:
        """Offset just past the furthest ELF image."""
        return max(r.end for r in self.records)

    @property
    def trailer(self) -> bytes:
        """Bytes after the last ELF image (empty for bundles ``join`` makes)."""
        return self.data[self.payload_end:]

    def index(self, record_or_index: RecordRef) -> int:
        """Table index of a record given as index or :class:`Record`.

        Raises:
            FatElfSelectError: no such record (field ``record``).
        """
        if isinstance(record_or_index, Record):
            for i, rec in enumerate(self.records):
                if rec == record_or_index:
                    return i
            raise FatElfSelectError(f"{record_or_index.describe()} at offset "
                                    f"{record_or_index.offset:#x} is not in this bundle",
                                    name=self.name, field="record", value=record_or_index)
        i = record_or_index
        if not isinstance(i, int) or not 0 <= i < len(self.records):
            raise FatElfSelectError(f"{i!r} does not exist (the bundle has "
                                    f"{len(self.records)} records)", name=self.name,
                                    field="record", value=i)
        return i

    def payload(self, record_or_index: RecordRef) -> bytes:
        """Exact bytes of one ELF image.

        Raises:
            FatElfSelectError: no such record (see :meth:`index`).
        """
        rec = self.records[self.index(record_or_index)]
        return self.data[rec.offset:rec.end]

    def split(self) -> list[tuple[Record, bytes]]:
        """Every record with its ELF image, in table order."""
        return [(rec, self.data[rec.offset:rec.end]) for rec in self.records]

    def find(self, arch: str | None = None, *, machine: int | None = None,
             word_size: int | None = None, byte_order: str | None = "little") -> Record:
        """The record a loader for the given target would pick.

        Give either ``arch`` (a name from :data:`fatelf.arches.TABLE`, an
        alias, optionally with a ``_be``/``_le`` suffix that overrides
        ``byte_order``) or ``machine`` (e_machine) with an optional
        ``word_size`` in bits; with neither, the host architecture is used.
        ``byte_order=None`` accepts either order.  Only records whose OSABI is
        0 (none), 3 (Linux) or 255 (standalone) qualify; the first qualifying
        record in table order wins.

        Raises:
            FatElfSelectError: nothing matches (field ``arch`` or ``machine``;
                the message lists the bundle's architectures), the name is
                unknown (field ``arch``), the host is unknown (field
                ``host``), or the arguments conflict.
        """
        if arch is not None and (machine is not None or word_size is not None):
            raise FatElfSelectError("give either an architecture name or "
                                    "machine/word_size, not both", name=self.name,
                                    field="arch", value=arch)
        if machine is None and word_size is not None:
            raise FatElfSelectError(f"{word_size} needs a machine number (or give an "
                                    f"architecture name instead)", name=self.name,
                                    field="word_size", value=word_size)
        requested: object
        if machine is None:
            try:
                arch = arch if arch is not None else host_arch()
                machine, word_size, order = parse_arch(arch)
            except FatElfSelectError as e:
                raise e.with_name(self.name) from None
            if order is not None:
                byte_order = order
            field, requested = "arch", arch
        else:
            field, requested = "machine", machine
        for rec in self.records:
            if (rec.machine == machine
                    and (word_size is None or rec.word_size == word_size)
                    and (byte_order is None or rec.byte_order == byte_order)
                    and rec.osabi in RUNTIME_OSABIS):
                return rec
        wanted = arch_name(machine, word_size, byte_order or "little") if word_size else \
            f"machine {machine}"
        held = ", ".join(
            r.arch if r.osabi in RUNTIME_OSABIS else f"{r.arch} (OSABI {osabi_name(r.osabi)})"
            for r in self.records)
        raise FatElfSelectError(
            f"no record for {wanted} (machine {machine}, "
            f"{f'{word_size}-bit' if word_size else 'any word size'}, "
            f"{byte_order + ' endian' if byte_order else 'any byte order'}, "
            f"OSABI none/linux/standalone); the bundle holds: {held}",
            name=self.name, field=field, value=requested)

    def select(self, arch: str | None = None, *, machine: int | None = None,
               word_size: int | None = None, byte_order: str | None = "little") -> bytes:
        """Bytes of the ELF :meth:`find` picks.

        Raises:
            FatElfSelectError: as :meth:`find`.
        """
        return self.payload(self.find(arch, machine=machine, word_size=word_size,
                                      byte_order=byte_order))


def read(path: str | os.PathLike) -> FatElf:
    """Read and validate the FatELF file at ``path`` (errors name ``path``).

    Raises:
        FatElfFormatError: the file cannot be read or is not a regular
            file (``field`` ``file``); as :meth:`FatElf.parse`.
    """
    return FatElf.parse(read_file(path), name=os.fspath(path))


#: Largest file the FatELF tools read whole, in bytes.
MAX_FILE_BYTES = 1 << 30


def read_file(path: str | os.PathLike) -> bytes:
    """The bytes of a regular file (opened without blocking; FIFOs, devices
    and directories refused), at most :data:`MAX_FILE_BYTES`.

    Raises:
        FatElfFormatError: as :func:`fatelf.files.read_regular`.
    """
    return read_regular(path, FatElfFormatError, MAX_FILE_BYTES)


def select(data, arch: str | None = None, *, machine: int | None = None,
           word_size: int | None = None, byte_order: str | None = "little",
           name: str = DEFAULT_NAME):
    """The ELF for a target: ``data`` itself when it is not a FatELF (no
    magic), otherwise the payload :meth:`FatElf.find` picks.

    Raises:
        FatElfFormatError: ``data`` has the magic but is not a valid FatELF.
        FatElfSelectError: as :meth:`FatElf.find`.
    """
    if not is_fatelf(data):
        return data
    return FatElf.parse(data, name).select(arch, machine=machine, word_size=word_size,
                                           byte_order=byte_order)


def split(data, name: str = DEFAULT_NAME) -> list[tuple[Record, bytes]]:
    """Validate ``data`` and return ``[(Record, elf bytes), ...]`` in table order.

    Raises:
        FatElfFormatError: as :meth:`FatElf.parse`.
    """
    return FatElf.parse(data, name).split()
