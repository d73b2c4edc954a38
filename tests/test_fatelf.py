"""Tests of the fatelf library on real ELF shared objects built with zig."""

from __future__ import annotations

import platform
import random
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fatelf
from fatelf import (
    FatElf,
    FatElfError,
    FatElfFormatError,
    FatElfInputError,
    FatElfSelectError,
    PortableKernelError,
    Record,
)

from conftest import ZIG_TARGETS


@pytest.fixture(scope="session")
def elfs(elf_files) -> dict[str, bytes]:
    """arch name -> ELF bytes, plus ``x86_64_v2`` (same target, other code)."""
    return {k: p.read_bytes() for k, p in elf_files.items()}


def with_osabi(elf: bytes, osabi: int, version: int = 0) -> bytes:
    """Same ELF with another e_ident[EI_OSABI]/[EI_ABIVERSION] (still a valid
    ELF, but a different FatELF target)."""
    b = bytearray(elf)
    b[7], b[8] = osabi, version
    return bytes(b)


@pytest.fixture(scope="session")
def three(elfs) -> list[bytes]:
    return [elfs["x86_64"], elfs["aarch64"], elfs["riscv64"]]


@pytest.fixture(scope="session")
def bundle(three) -> bytes:
    return fatelf.join(three)


# --------------------------------------------------------------------------
# An independent writer, written from the specification text only
# (icculus/fatelf docs/fatelf-specification.txt; byte order codes from
# include/fatelf.h: 0 = big endian, 1 = little endian).


def spec_write(elfs: list[bytes], *, file_order=None, gap_pages=0, trailer=b"") -> bytes:
    """FatELF v1: u32 magic, u16 version, u8 count, u8 reserved, then per ELF
    u16 machine, u8 osabi, u8 osabi version, u8 word size, u8 byte order,
    2 reserved bytes, u64 offset, u64 size (all little endian); ELFs start
    on 4096-byte boundaries.  ``file_order`` lets the images sit in the file
    in another order than the table lists them."""
    count = len(elfs)
    order = list(file_order) if file_order is not None else list(range(count))
    offsets = [0] * count
    pos = 8 + 24 * count
    for i in order:
        pos = ((pos + 4095) // 4096 + gap_pages) * 4096
        offsets[i] = pos
        pos += len(elfs[i])
    out = bytearray(0xFA700E1F.to_bytes(4, "big"))  # bytes FA 70 0E 1F
    out += (1).to_bytes(2, "little") + bytes([count, 0])
    for elf, off in zip(elfs, offsets):
        little = elf[5] == 1
        machine = int.from_bytes(elf[18:20], "little" if little else "big")
        out += machine.to_bytes(2, "little")
        out += bytes([elf[7], elf[8], elf[4], 1 if little else 0, 0, 0])
        out += off.to_bytes(8, "little") + len(elf).to_bytes(8, "little")
    image = bytearray(pos)
    image[:len(out)] = out
    for elf, off in zip(elfs, offsets):
        image[off:off + len(elf)] = elf
    return bytes(image) + trailer


# --------------------------------------------------------------------------
# Helpers for poking at a bundle's record table.

FIELD = {"machine": (0, 2), "osabi": (2, 1), "osabi_version": (3, 1), "word_size": (4, 1),
         "byte_order": (5, 1), "reserved0": (6, 1), "reserved1": (7, 1), "offset": (8, 8),
         "size": (16, 8)}


def set_field(data: bytes, index: int, field: str, value: int) -> bytes:
    at, width = FIELD[field]
    pos = 8 + 24 * index + at
    b = bytearray(data)
    b[pos:pos + width] = value.to_bytes(width, "little")
    return bytes(b)


def get_field(data: bytes, index: int, field: str) -> int:
    at, width = FIELD[field]
    pos = 8 + 24 * index + at
    return int.from_bytes(data[pos:pos + width], "little")


def poke(data: bytes, pos: int, raw: bytes) -> bytes:
    b = bytearray(data)
    b[pos:pos + len(raw)] = raw
    return bytes(b)


# --------------------------------------------------------------------------
# Writing


def test_join_layout(elfs, three, bundle):
    assert fatelf.is_fatelf(bundle)
    assert bundle[:4] == bytes.fromhex("FA700E1F")
    assert int.from_bytes(bundle[4:6], "little") == 1
    assert bundle[6] == 3 and bundle[7] == 0
    fat = FatElf.parse(bundle)
    assert fat.arches == ["x86_64", "aarch64", "riscv64"]  # sorted by e_machine
    previous_end = 8 + 24 * 3
    for rec, elf in zip(fat.records, three):
        assert rec.offset % 4096 == 0
        assert rec.offset == -(-previous_end // 4096) * 4096  # next boundary
        assert set(bundle[previous_end:rec.offset]) <= {0}  # zero padding
        assert rec.size == len(elf)
        assert bundle[rec.offset:rec.end] == elf
        previous_end = rec.end
    assert len(bundle) == previous_end  # nothing after the last ELF
    assert fat.trailer == b""


def test_join_record_fields(elfs):
    fat = FatElf.parse(fatelf.join(list(elfs[k] for k in ZIG_TARGETS)))
    got = {r.arch: r for r in fat.records}
    assert set(got) == set(ZIG_TARGETS)
    assert got["x86_64"].target == (62, 0, 0, 64, "little")
    assert got["aarch64"].target == (183, 0, 0, 64, "little")
    assert got["riscv64"].target == (243, 0, 0, 64, "little")
    assert got["x86_32"].target == (3, 0, 0, 32, "little")
    assert got["arm32"].target == (40, 0, 0, 32, "little")
    assert got["riscv32"].target == (243, 0, 0, 32, "little")
    # e_machine of a big-endian ELF is stored big-endian inside the ELF.
    assert got["aarch64_be"].target == (183, 0, 0, 64, "big")
    assert elfs["aarch64_be"][18:20] == b"\x00\xb7"
    keys = [r.sort_key for r in fat.records]
    assert keys == sorted(keys)
    # on disk: word size code 1/2, byte order code 0 for big endian
    raw = fatelf.join([elfs["aarch64_be"], elfs["x86_32"]])
    assert get_field(raw, 0, "machine") == 3 and get_field(raw, 0, "word_size") == 1
    assert get_field(raw, 0, "byte_order") == 1
    assert get_field(raw, 1, "machine") == 183 and get_field(raw, 1, "word_size") == 2
    assert get_field(raw, 1, "byte_order") == 0


def test_join_is_independent_of_input_order(elfs):
    items = [elfs[k] for k in ZIG_TARGETS]
    expected = fatelf.join(items)
    rng = random.Random(1)
    for _ in range(5):
        rng.shuffle(items)
        assert fatelf.join(items) == expected


def test_split_then_join_is_byte_identical(elfs):
    items = [elfs[k] for k in ZIG_TARGETS] + [with_osabi(elfs["x86_64"], 3)]
    original = fatelf.join(items)
    parts = fatelf.split(original)
    assert sorted(e for _, e in parts) == sorted(items)
    assert fatelf.join([e for _, e in parts]) == original
    assert fatelf.join([e for _, e in reversed(parts)]) == original


def test_select_returns_exact_input_bytes(elfs):
    names = list(ZIG_TARGETS)
    fat = FatElf.parse(fatelf.join([elfs[k] for k in names]))
    for name in names:
        assert fat.select(name) == elfs[name]
        assert fat.payload(fat.find(name)) == elfs[name]
        assert fatelf.select(fat.data, name) == elfs[name]
    for i, rec in enumerate(fat.records):
        assert fat.payload(i) == fat.payload(rec) == elfs[rec.arch]


def test_join_errors(elfs):
    with pytest.raises(FatElfInputError, match=r"^b\.so: e_ident\[EI_MAG\]: not an ELF "
                                               r"file \(starts with 68 65 6c 6c") as e:
        fatelf.join([elfs["x86_64"], b"hello, world" * 10], names=["a.so", "b.so"])
    assert isinstance(e.value, PortableKernelError)
    assert (e.value.name, e.value.field, e.value.value) == ("b.so", "e_ident[EI_MAG]", b"hell")
    with pytest.raises(FatElfInputError, match=r"^c\.so: target: same target as a\.so") as e:
        fatelf.join([elfs["x86_64"], elfs["aarch64"], elfs["x86_64_v2"]],
                    names=["a.so", "b.so", "c.so"])
    assert (e.value.name, e.value.field, e.value.value) == ("c.so", "target",
                                                            (62, 0, 0, 64, "little"))
    # without names, errors name the bundle being built and the input's index
    with pytest.raises(FatElfInputError, match=r"^<memory>: elf\[1\]\.target: same target "
                                               r"as elf\[0\]") as e:
        fatelf.join([elfs["x86_64"], elfs["x86_64_v2"]])
    assert (e.value.name, e.value.field) == ("<memory>", "elf[1].target")
    with pytest.raises(FatElfInputError, match="no ELF") as e:
        fatelf.join([])
    assert (e.value.field, e.value.value) == ("elfs", 0)
    with pytest.raises(FatElfInputError, match=r"^<memory>: names: 1 names for 2 ELFs"):
        fatelf.join([elfs["x86_64"], elfs["aarch64"]], names=["a.so"])
    with pytest.raises(FatElfInputError, match=r"elf\[0\]\.e_ident\[EI_CLASS\]: 9 ") as e:
        fatelf.join([poke(elfs["x86_64"], 4, b"\x09")])
    assert (e.value.name, e.value.field, e.value.value) == (
        "<memory>", "elf[0].e_ident[EI_CLASS]", 9)
    with pytest.raises(FatElfInputError, match=r"e_ident\[EI_DATA\]: 0 is neither"):
        fatelf.join([poke(elfs["x86_64"], 5, b"\x00")])
    with pytest.raises(FatElfInputError, match="size: 0x28 is smaller than the 64-byte "
                                               "ELF64 header") as e:
        fatelf.join([elfs["x86_64"][:40]])
    assert (e.value.field, e.value.value) == ("elf[0].size", 40)
    with pytest.raises(FatElfInputError, match="size: 0xa is smaller than the 16-byte"):
        fatelf.join([elfs["x86_64"][:10]])
    with pytest.raises(FatElfInputError, match=r"header\.record_count: 256 ELFs; a FatELF "
                                               r"holds 1 to 255") as e:
        fatelf.pack([(Record(62, 0, i, 64, "little"), b"") for i in range(256)])
    assert e.value.value == 256
    # the same machine with different OSABIs are different targets
    fat = FatElf.parse(fatelf.join([elfs["x86_64"], with_osabi(elfs["x86_64"], 3)]))
    assert [r.osabi for r in fat.records] == [0, 3]


def test_remove_and_replace(elfs, three, bundle):
    fat = FatElf.parse(bundle)
    smaller = FatElf.parse(fatelf.remove(bundle, 1))
    assert smaller.arches == ["x86_64", "riscv64"]
    assert [e for _, e in smaller.split()] == [three[0], three[2]]
    assert fatelf.remove(bundle, fat.records[1]) == smaller.data
    assert fatelf.remove(bundle, 1) == fatelf.join([three[0], three[2]])
    with pytest.raises(FatElfInputError, match=r"^<memory>: record 0: cannot remove x86_64, "
                                               r"it is the only record") as e:
        fatelf.remove(fatelf.join([three[0]]), 0)
    assert (e.value.field, e.value.value) == ("record 0", "x86_64")
    with pytest.raises(FatElfSelectError, match=r"^b\.sos: record: 7 does not exist") as e:
        fatelf.remove(bundle, 7, name="b.sos")
    assert (e.value.name, e.value.field, e.value.value) == ("b.sos", "record", 7)

    new = fatelf.replace(bundle, elfs["x86_64_v2"])
    assert elfs["x86_64_v2"] != elfs["x86_64"]
    assert FatElf.parse(new).select("x86_64") == elfs["x86_64_v2"]
    assert [e for _, e in fatelf.split(new)][1:] == three[1:]
    with pytest.raises(FatElfInputError, match=r"^new\.so: target: no record of b\.sos has "
                                               r"its target riscv32") as e:
        fatelf.replace(bundle, elfs["riscv32"], name="b.sos", elf_name="new.so")
    assert e.value.value == (243, 0, 0, 32, "little")

    # bytes after the last ELF ("junk" to the reference tools) are carried along
    junky = spec_write(three, trailer=b"JUNK")
    assert FatElf.parse(junky).trailer == b"JUNK"
    assert fatelf.remove(junky, 0).endswith(b"JUNK")
    assert FatElf.parse(fatelf.replace(junky, elfs["x86_64_v2"])).trailer == b"JUNK"


# --------------------------------------------------------------------------
# Reading what an independent writer produced


@pytest.mark.parametrize("file_order,gap_pages,trailer", [
    (None, 0, b""),
    ([3, 2, 1, 0], 0, b""),
    ([1, 3, 0, 2], 2, b"\x7fELF trailing junk"),
])
def test_parse_independent_writer(elfs, file_order, gap_pages, trailer):
    items = [elfs["riscv64"], elfs["aarch64_be"], elfs["x86_32"],
             with_osabi(elfs["x86_64"], 3, 1)]
    data = spec_write(items, file_order=file_order, gap_pages=gap_pages, trailer=trailer)
    fat = FatElf.parse(data, "indep.sos")
    assert fat.name == "indep.sos"
    assert fat.arches == ["riscv64", "aarch64_be", "x86_32", "x86_64"]  # table order kept
    assert [fat.payload(i) for i in range(4)] == items
    assert fat.records[3].target == (62, 3, 1, 64, "little")
    assert fat.records[1].byte_order == "big"
    assert fat.trailer == trailer
    assert fat.select("x86_32") == elfs["x86_32"]
    assert fat.select("aarch64_be") == elfs["aarch64_be"]
    assert fat.select(machine=183, byte_order=None) == elfs["aarch64_be"]
    assert fat.select("x86_64") == items[3]  # OSABI 3 (Linux) is acceptable
    # our join of the same ELFs holds the same records, in canonical order
    ours = FatElf.parse(fatelf.join(items))
    assert sorted(r.target for r in ours.records) == sorted(r.target for r in fat.records)


def test_independent_writer_matches_join_for_sorted_input(elfs, three):
    assert spec_write(three) == fatelf.join(three)


# --------------------------------------------------------------------------
# Selection


def test_find_variants(elfs):
    items = [elfs["x86_64"], elfs["x86_32"], elfs["arm32"], elfs["aarch64"],
             with_osabi(elfs["riscv64"], 9)]  # FreeBSD: a runtime would skip it
    fat = FatElf.parse(fatelf.join(items), "v.sos")
    assert fat.find("amd64").arch == "x86_64"
    assert fat.find("i686").arch == fat.find("x86").arch == "x86_32"
    assert fat.find("armv7").arch == "arm32"
    assert fat.find("ARM64").arch == "aarch64"
    assert fat.find(machine=3).arch == "x86_32"
    assert fat.find(machine=62, word_size=64).arch == "x86_64"
    with pytest.raises(fatelf.FatElfSelectError) as e:
        fat.find("riscv64")
    msg = str(e.value)
    assert msg.startswith("v.sos: arch: no record for riscv64")
    assert msg.endswith("holds: x86_32, arm32, x86_64, aarch64, riscv64 (OSABI freebsd)")
    assert (e.value.name, e.value.field, e.value.value) == ("v.sos", "arch", "riscv64")
    with pytest.raises(FatElfSelectError, match="no record for aarch64_be"):
        fat.find("aarch64", byte_order="big")
    with pytest.raises(FatElfSelectError, match=r"^v\.sos: machine: no record for machine 99"
                       ) as e:
        fat.find(machine=99)
    assert e.value.value == 99
    with pytest.raises(FatElfSelectError,
                       match=r"^v\.sos: arch: unknown architecture 'vax'.*x86_64") as e:
        fat.find("vax")
    assert (e.value.name, e.value.field, e.value.value) == ("v.sos", "arch", "vax")
    with pytest.raises(FatElfSelectError, match="either"):
        fat.find("x86_64", machine=62)
    with pytest.raises(FatElfSelectError, match="word_size: 32 needs a machine") as e:
        fat.find(word_size=32)
    assert (e.value.field, e.value.value) == ("word_size", 32)


def test_find_defaults_to_host(elfs):
    fat = FatElf.parse(fatelf.join([elfs[k] for k in ZIG_TARGETS]))
    host = fatelf.host_arch()
    assert host in fatelf.ARCHES
    if host in fat.arches:
        assert fat.find().arch == host
        assert fatelf.select(fat.data) == elfs[host]
    if platform.machine().lower() in ("x86_64", "amd64") and sys.maxsize > 2**32:
        assert host == "x86_64"


def test_select_passes_non_fatelf_through(elfs):
    elf = elfs["aarch64"]
    assert fatelf.select(elf, "x86_64") is elf
    assert fatelf.select(b"", "x86_64") == b""
    assert not fatelf.is_fatelf(elf)
    assert not fatelf.is_fatelf(b"\xfa\x70\x0e")
    assert fatelf.is_fatelf(b"\xfa\x70\x0e\x1f")
    assert fatelf.is_fatelf(bytearray(b"\xfa\x70\x0e\x1f\x01\x00"))
    assert fatelf.is_fatelf(memoryview(b"\xfa\x70\x0e\x1f"))


def test_arch_table():
    assert fatelf.MAGIC == 0x1F0E70FA
    for name, target in {"x86_64": (62, 64), "aarch64": (183, 64), "riscv64": (243, 64),
                         "x86_32": (3, 32), "arm32": (40, 32), "riscv32": (243, 32)}.items():
        assert fatelf.ARCHES[name] == target
        assert fatelf.arch_target(name) == target
    for alias, name in {"i386": "x86_32", "i686": "x86_32", "x86": "x86_32",
                        "arm": "arm32", "armv7": "arm32", "arm64": "aarch64",
                        "amd64": "x86_64"}.items():
        assert fatelf.arch_target(alias) == fatelf.ARCHES[name]
    with pytest.raises(FatElfSelectError,
                       match="unknown architecture 'pdp11'; known: .*riscv32") as e:
        fatelf.arch_target("pdp11")
    assert (e.value.field, e.value.value) == ("arch", "pdp11")
    # every name and alias of the one table maps to its target
    for info in fatelf.TABLE:
        for name in (info.name, *info.aliases):
            assert fatelf.arch_target(name) == info.target == fatelf.ARCHES[info.name]
            assert fatelf.lookup(name.upper()) is info
    assert set(fatelf.RUNTIME_ARCHES) == {"x86_64", "aarch64", "riscv64", "x86_32", "arm32",
                                          "riscv32"}
    rec = Record(99, 0, 0, 32, "big")
    assert rec.arch == "machine99-32_be"
    assert Record(99, 0, 0, 64, "little").arch == "machine99-64"
    assert fatelf.arch_target("machine99-32") == (99, 32)
    assert Record(40, 0, 0, 32, "little").arch == "arm32"
    with pytest.raises(FatElfError, match="^Record: word_size: invalid value 16$") as e:
        Record(62, 0, 0, 16, "little")
    assert (e.value.name, e.value.field, e.value.value) == ("Record", "word_size", 16)
    with pytest.raises(FatElfError, match="byte_order"):
        Record(62, 0, 0, 64, "middle")


def test_read_names_errors_after_path(tmp_path, bundle):
    good = tmp_path / "good.sos"
    good.write_bytes(bundle)
    assert fatelf.read(good).name == str(good)
    bad = tmp_path / "bad.sos"
    bad.write_bytes(bundle[:100])
    with pytest.raises(FatElfFormatError,
                       match=f"^{re.escape(str(bad))}: record 0\\.offset: 0x1000 \\+ size") as e:
        fatelf.read(bad)
    assert (e.value.name, e.value.field, e.value.value) == (str(bad), "record 0.offset", 0x1000)


# --------------------------------------------------------------------------
# Invalid bundles


def _size_outside(b):
    return set_field(b, 2, "size", 0x100000)


def _overlap(b):
    return set_field(b, 1, "offset", get_field(b, 0, "offset") + 0)


def _duplicate(b):
    b = set_field(b, 1, "machine", 62)
    return b


def _not_elf(b):
    return poke(b, get_field(b, 1, "offset"), b"\0\0\0\0")


# case -> (mutation, message pattern, the error's field)
BAD = {
    "truncated header": (lambda b: b[:5], r"^bad\.sos: header: file is 5 bytes, shorter",
                         "header"),
    "empty file": (lambda b: b"", r"^bad\.sos: header: file is 0 bytes", "header"),
    "truncated record table": (lambda b: b[:8 + 24 * 3 - 1],
                               r"^bad\.sos: header\.record_count: 3 needs a 0x50-byte",
                               "header.record_count"),
    "bad magic": (lambda b: poke(b, 0, b"\x7fELF"),
                  r"^bad\.sos: header\.magic: 0x464c457f is not the FatELF magic 0x1f0e70fa$",
                  "header.magic"),
    "unknown version": (lambda b: poke(b, 4, b"\x02\x00"),
                        r"^bad\.sos: header\.version: 2 is not supported", "header.version"),
    "zero records": (lambda b: poke(b, 6, b"\x00"), r"^bad\.sos: header\.record_count: 0 ",
                     "header.record_count"),
    "header reserved": (lambda b: poke(b, 7, b"\x01"),
                        r"^bad\.sos: header\.reserved: 0x01 is not zero$", "header.reserved"),
    "record reserved": (lambda b: set_field(b, 1, "reserved1", 5),
                        r"^bad\.sos: record 1\.reserved1: 0x05 is not zero$",
                        "record 1.reserved1"),
    "bad word size": (lambda b: set_field(b, 1, "word_size", 3),
                      r"record 1\.word_size: 3 is neither", "record 1.word_size"),
    "bad byte order": (lambda b: set_field(b, 1, "byte_order", 2),
                       r"record 1\.byte_order: 2 is neither", "record 1.byte_order"),
    "size outside file": (_size_outside, r"^bad\.sos: record 2\.size: 0x100000 at offset "
                                         r"0x3000 lies outside the file \(0x3[0-9a-f]{3} bytes\)",
                          "record 2.size"),
    "offset outside file": (lambda b: set_field(b, 2, "offset", 0x7000),
                            r"record 2\.offset: 0x7000 \+ size 0x[0-9a-f]+ lies outside",
                            "record 2.offset"),
    "huge offset": (lambda b: set_field(b, 0, "offset", 2**64 - 4096),
                    r"record 0\.offset: 0xfffffffffffff000 \+ size", "record 0.offset"),
    "offset in table": (lambda b: set_field(b, 0, "offset", 0),
                        r"^bad\.sos: record 0\.offset: 0x0 lies inside the header and record "
                        r"table", "record 0.offset"),
    "unaligned offset": (lambda b: set_field(b, 1, "offset", 0x2008),
                         r"record 1\.offset: 0x2008 is not aligned to 0x1000",
                         "record 1.offset"),
    "empty record": (lambda b: set_field(b, 0, "size", 0), r"record 0\.size: 0 ",
                     "record 0.size"),
    "overlapping records": (_overlap, r"^bad\.sos: record 1\.offset: 0x1000 \+ size "
                                      r"0x[0-9a-f]+ overlaps record 0", "record 1.offset"),
    "duplicate targets": (_duplicate,
                          r"^bad\.sos: record 1: target x86_64 .* duplicates record 0$",
                          "record 1"),
    "machine disagrees": (lambda b: set_field(b, 1, "machine", 40),
                          r"^bad\.sos: record 1\.machine: 40 disagrees with the ELF header's "
                          r"e_machine 183$", "record 1.machine"),
    "word size disagrees": (lambda b: set_field(b, 0, "word_size", 1),
                            r"record 0\.word_size: 1 \(32-bit\) disagrees .* EI_CLASS 2",
                            "record 0.word_size"),
    "byte order disagrees": (lambda b: set_field(b, 0, "byte_order", 0),
                             r"record 0\.byte_order: 0 \(big endian\) disagrees .* EI_DATA 1",
                             "record 0.byte_order"),
    "osabi disagrees": (lambda b: set_field(b, 2, "osabi", 3),
                        r"record 2\.osabi: 3 disagrees .* EI_OSABI 0", "record 2.osabi"),
    "abi version disagrees": (lambda b: set_field(b, 2, "osabi_version", 4),
                              r"record 2\.osabi_version: 4 disagrees .* EI_ABIVERSION 0",
                              "record 2.osabi_version"),
    "non-ELF payload": (_not_elf, r"^bad\.sos: record 1\.payload\.e_ident\[EI_MAG\]: not an "
                                  r"ELF file \(starts with 00 00 00 00",
                        "record 1.payload.e_ident[EI_MAG]"),
    "bad ELF class": (lambda b: poke(b, 0x2004, b"\x07"),
                      r"^bad\.sos: record 1\.payload\.e_ident\[EI_CLASS\]: 7 is neither",
                      "record 1.payload.e_ident[EI_CLASS]"),
    "payload shorter than ELF header": (lambda b: set_field(b, 0, "size", 40),
                                        r"record 0\.payload\.size: 0x28 is smaller than the "
                                        r"64-byte", "record 0.payload.size"),
}

# the offending value of a few cases
BAD_VALUES = {"bad magic": 0x464C457F, "unknown version": 2, "record reserved": 5,
              "size outside file": 0x100000, "offset outside file": 0x7000,
              "machine disagrees": 40, "byte order disagrees": 0, "bad ELF class": 7,
              "non-ELF payload": b"\0\0\0\0", "payload shorter than ELF header": 40,
              "truncated header": 5, "truncated record table": 3}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_bundles_raise(bundle, case):
    mutate, pattern, field = BAD[case]
    bad = mutate(bundle)
    with pytest.raises(FatElfFormatError, match=pattern) as e:
        FatElf.parse(bad, "bad.sos")
    assert "\n" not in str(e.value)
    assert isinstance(e.value, PortableKernelError)
    assert e.value.name == "bad.sos"
    assert e.value.field == field
    if case in BAD_VALUES:
        assert e.value.value == BAD_VALUES[case]
    assert str(e.value) == f"bad.sos: {field}: {e.value.message}"
    with pytest.raises(FatElfError):
        fatelf.split(bad, "bad.sos")
    if fatelf.is_fatelf(bad):
        with pytest.raises(FatElfError):
            fatelf.select(bad, "x86_64", name="bad.sos")


def test_default_name_and_alignment_option(bundle):
    with pytest.raises(FatElfError, match=r"^<memory>: header"):
        FatElf.parse(bundle[:3])
    moved = bytearray(bundle[:0x1000 + 0x800]) + bundle[0x1000:]
    moved = set_field(bytes(moved), 0, "offset", 0x1800)
    for i in (1, 2):
        moved = set_field(moved, i, "offset", get_field(moved, i, "offset") + 0x800)
    with pytest.raises(FatElfFormatError, match="not aligned"):
        FatElf.parse(moved)
    assert FatElf.parse(moved, alignment=1).payload(2) == FatElf.parse(bundle).payload(2)


# --------------------------------------------------------------------------
# Property tests: only FatElfError ever escapes the parser.


def _parse_only_fatelf_errors(data: bytes) -> None:
    try:
        fat = FatElf.parse(data, "fuzz.sos")
    except FatElfError as e:
        assert e.name == "fuzz.sos" and e.field
        assert str(e) == f"fuzz.sos: {e.field}: {e.message}"
        return
    # whatever parses must be internally consistent
    for rec, elf in fat.split():
        assert len(elf) == rec.size and elf[:4] == b"\x7fELF"
        assert fatelf.join([elf]) is not None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_fuzz_random_bytes(data):
    _parse_only_fatelf_errors(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_after_valid_magic(data):
    _parse_only_fatelf_errors(bytes.fromhex("FA700E1F0100") + data)


class _Bytes(bytes):
    """bytes with a short repr, so failing examples stay readable."""

    def __repr__(self):
        return f"<{len(self)} bytes>"


@pytest.fixture(scope="session")
def quiet_bundle(bundle) -> bytes:
    return _Bytes(bundle)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_mutated_bundles(quiet_bundle, data):
    b = bytearray(quiet_bundle)
    # concentrate mutations on the header, the record table and ELF headers
    hot = st.one_of(st.integers(0, 8 + 24 * 3 - 1), st.integers(0x1000, 0x1040),
                    st.integers(0x2000, 0x2040), st.integers(0, len(b) - 1))
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["set", "flip", "cut", "insert", "u64"]))
        pos = data.draw(hot) % len(b)
        if kind == "set":
            b[pos] = data.draw(st.integers(0, 255))
        elif kind == "flip":
            b[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del b[pos:pos + data.draw(st.integers(1, 64))]
        elif kind == "insert":
            b[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
        elif kind == "u64":
            rec = data.draw(st.integers(0, 2))
            field = data.draw(st.sampled_from(["offset", "size"]))
            value = data.draw(st.one_of(st.integers(0, 2**64 - 1),
                                        st.integers(0, 0x4000)))
            b = bytearray(set_field(bytes(b), rec, field, value))
        if len(b) == 0:
            break
    _parse_only_fatelf_errors(bytes(b))
