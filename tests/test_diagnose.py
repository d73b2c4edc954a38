"""elfloader.diagnose: symbols, source lines, disassembly, data-address
descriptions and fault reports, on real executables and plugins."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import elfloader
from elfloader import diagnose
from elfloader.backend.emulated import qemu_program
from elfloader.diagnose import (
    FaultReport,
    Region,
    Symbolizer,
    describe_address,
    disassemble,
    fault_report,
    section_symbols,
    segment_regions,
)
from fatelf import arches

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "hal_cpu" / "samples"
PREBUILT = ROOT / "sample_plugins" / "prebuilt"
ARCHES = list(arches.RUNTIME_ARCHES)
BASE = 0x40000000
LIBRARY_QUERY = "iree_hal_executable_library_query"
PLUGIN_QUERY = "iree_hal_executable_plugin_query"

#: First instruction of iree_hal_executable_plugin_query in the committed
#: sample plugins (sample_plugins/prebuilt, rebuilt byte-identically).
PLUGIN_QUERY_FIRST = {
    "x86_64": "push rbp",
    "x86_32": "push ebp",
    "aarch64": "cmp w0, #0",
    "arm32": "push {r11, lr}",
    "riscv64": "addi sp, sp, -0x10",
    "riscv32": "addi sp, sp, -0x10",
}


def _symtab(path) -> dict[str, tuple[int, int, str]]:
    """name -> (value, size, type) of the static .symtab, read by pyelftools."""
    with open(path, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".symtab")
        return {s.name: (s["st_value"], s["st_size"], s["st_info"]["type"])
                for s in sec.iter_symbols() if s.name}


# --- symbols of committed executables and plugins ---------------------------

@pytest.mark.parametrize("arch", ARCHES)
def test_sample_executable_symbols(arch):
    path = SAMPLES / f"matmul_{arch}.so"
    image = elfloader.read_image(path)
    static = _symtab(path)
    assert "_DYNAMIC" in static                      # .symtab only
    assert "_DYNAMIC" not in {s["name"] for s in image.symbols}
    names = {s["name"]: s["st_value"] for s in section_symbols(image)}
    assert names["_DYNAMIC"] == static["_DYNAMIC"][0]
    assert names[LIBRARY_QUERY] == image.exports[LIBRARY_QUERY]

    sym = Symbolizer(image, BASE)
    query = image.exports[LIBRARY_QUERY]
    assert sym.symbolize(BASE + query) == LIBRARY_QUERY
    assert sym.symbolize(BASE + query + 4) == LIBRARY_QUERY + "+0x4"
    assert sym.lookup(BASE + query + 4) == (LIBRARY_QUERY, 4)
    assert sym.symbolize(BASE + static["_DYNAMIC"][0] + 8) == "_DYNAMIC+0x8"
    size = static[LIBRARY_QUERY][1]
    assert sym.symbolize(BASE + query + size) != LIBRARY_QUERY + f"+{size:#x}"
    assert sym.symbolize(BASE + image.vaddr_max + 0x1000) is None
    assert sym.symbolize(BASE - 0x1000) is None
    assert not sym.contains(BASE - 0x1000) and sym.contains(BASE + query)
    assert sym.source_line(BASE + query) is None      # built without DWARF


@pytest.mark.parametrize("arch", ARCHES)
def test_sample_plugin_symbols(arch):
    path = PREBUILT / f"standalone_{arch}.so"
    image = elfloader.read_image(path)
    sym = Symbolizer(image, 0x10000)
    query = image.exports[PLUGIN_QUERY]
    assert sym.symbolize(0x10000 + query + 2) == PLUGIN_QUERY + "+0x2"
    dynamic = _symtab(path)["_DYNAMIC"][0]
    assert sym.symbolize(0x10000 + dynamic) == "_DYNAMIC"


def test_entry_points_name_stripped_kernels():
    """Kernels of a stripped executable are named from its export table."""
    from hal_cpu.library import Executable

    with Executable(SAMPLES / "matmul_riscv64.so", backend="emulated") as exe:
        module = exe.module
        plain = Symbolizer(module.image, module.base)
        points = {e.label: e.address for e in exe.exports}
        named = Symbolizer(module.image, module.base, points)
        for e in exe.exports:
            assert plain.symbolize(e.address + 8) is None
            assert named.symbolize(e.address + 8) == f"{e.label}+0x8"
            assert named.symbolize(e.address) == e.label
        query = module.exports[LIBRARY_QUERY]
        assert named.symbolize(query + 2) == LIBRARY_QUERY + "+0x2"


# --- DWARF of an IREE executable compiled with debug information ------------

@pytest.fixture(scope="module")
def dwarf_build(compiled):
    """(image, kernel name -> (low_pc, high_pc)) of mul_add for aarch64,
    compiled with iree-compile's default debug information."""
    path = compiled("mul_add", "aarch64").so_files[0]
    image = elfloader.read_image(path)
    elf = ELFFile(io.BytesIO(image.data))
    assert elf.has_dwarf_info()
    dwarf = elf.get_dwarf_info()
    kernels, rows = {}, 0
    for cu in dwarf.iter_CUs():
        for die in cu.iter_DIEs():
            if die.tag == "DW_TAG_subprogram" and "DW_AT_low_pc" in die.attributes:
                low = die.attributes["DW_AT_low_pc"].value
                kernels[die.attributes["DW_AT_name"].value.decode()] = (
                    low, low + die.attributes["DW_AT_high_pc"].value)
        rows += sum(1 for e in dwarf.line_program_for_CU(cu).get_entries()
                    if e.state is not None and e.state.line)
    assert kernels and rows, "iree-compile kept no DWARF line information"
    return path, image, kernels


def test_dwarf_kernel_name_and_line(dwarf_build):
    path, image, kernels = dwarf_build
    assert not set(kernels) & set(_symtab(path))      # named by DWARF only
    sym = Symbolizer(image, BASE)
    lines = 0
    for name, (low, high) in kernels.items():
        assert sym.symbolize(BASE + low) == name
        for v in range(low, high, 4):
            assert sym.lookup(BASE + v) == (name, v - low)
            line = sym.source_line(BASE + v)
            if line is not None:
                assert re.fullmatch(r".+:[1-9][0-9]*", line)
                lines += 1
    assert lines
    query = image.exports[LIBRARY_QUERY]
    assert sym.symbolize(BASE + query) == LIBRARY_QUERY
    assert sym.source_line(BASE + query) is None


def test_dwarf_line_matches_the_executable_export(dwarf_build):
    """The kernel the executable's export table points at has a line."""
    from hal_cpu.library import Executable

    path, _, kernels = dwarf_build
    with Executable(path, backend="emulated") as exe:
        sym = Symbolizer(exe.module.image, exe.module.base)
        for e in exe.exports:
            low, high = kernels[e.name]
            assert e.address - exe.module.base == low
            found = [sym.source_line(a) for a in range(e.address, e.address + high - low, 4)]
            assert any(found)


# --- static functions and DWARF of a C file ---------------------------------

C_FIXTURE = """\
static volatile int counter;

__attribute__((noinline)) static int scale(int x) {
  counter += x;
  return x * 3 + counter;
}

__attribute__((visibility("default"))) int diag_entry(int x) {
  return scale(x) + 1;
}
"""
SCALE_LINES = {3, 4, 5}


@pytest.fixture(scope="module")
def c_fixture(tmp_path_factory):
    """name -> path of diag_fixture.c built with -g: x86_64, arm32 (A32) and
    arm32 in Thumb mode."""
    pytest.importorskip("ziglang")
    from hal_cpu.buildtools import zig as zigbuild

    work = tmp_path_factory.mktemp("diag-c")
    (work / "diag_fixture.c").write_text(C_FIXTURE)
    zig = zigbuild.zig_command()
    out = {}
    arm = list(arches.lookup("arm32").zig_flags)
    thumb = [f.replace("arm-", "thumb-", 1) if f.startswith("arm-") else f for f in arm]
    assert thumb != arm
    for name, flags in (("x86_64", arches.lookup("x86_64").zig_flags),
                        ("arm32", arm), ("thumb", thumb)):
        zigbuild.run(zig + ["cc", *flags, "-fPIC", "-ffreestanding",
                            "-fno-unwind-tables", "-fno-asynchronous-unwind-tables",
                            "-g", "-O2", "-c", "diag_fixture.c", "-o", f"{name}.o"], work)
        zigbuild.run(zig + ["ld.lld", "-nostdlib", "-shared", "--hash-style=sysv",
                            "-o", f"{name}.so", f"{name}.o"], work)
        out[name] = work / f"{name}.so"
    return out


@pytest.mark.parametrize("name", ["x86_64", "arm32", "thumb"])
def test_static_function_and_line(c_fixture, name):
    path = c_fixture[name]
    image = elfloader.read_image(path)
    static = _symtab(path)
    value, size, kind = static["scale"]
    assert kind == "STT_FUNC" and "scale" not in image.exports
    assert bool(value & 1) == (name == "thumb")
    start = value & ~1
    sym = Symbolizer(image, BASE)
    assert sym.symbolize(BASE + start) == "scale"
    assert sym.symbolize(BASE + start + 2) == "scale+0x2"
    assert sym.symbolize(BASE + start + size - 1) == f"scale+{size - 1:#x}"
    assert sym.symbolize(BASE + static["counter"][0]) == "counter"
    file, line = sym.source_line(BASE + start + 2).rsplit(":", 1)
    assert Path(file).name == "diag_fixture.c" and int(line) in SCALE_LINES
    entry = image.exports["diag_entry"] & ~1
    assert sym.symbolize(BASE + entry) == "diag_entry"
    file, line = sym.source_line(BASE + entry).rsplit(":", 1)
    assert int(line) in {8, 9}


def test_thumb_disassembly(c_fixture):
    image = elfloader.read_image(c_fixture["thumb"])
    pc = image.exports["diag_entry"]
    assert pc & 1
    code = image.read(pc & ~1, 16, "test")
    thumb = disassemble("arm32", code, pc)
    arm = disassemble("arm32", code, pc & ~1)
    assert not thumb.startswith("(")
    assert thumb != arm
    insns = _capstone_all("CS_ARCH_ARM", "CS_MODE_THUMB", code, pc & ~1)
    assert thumb == insns[0]


def _capstone_all(arch, mode, code, address):
    import capstone
    md = capstone.Cs(getattr(capstone, arch), getattr(capstone, mode))
    return [f"{i.mnemonic} {i.op_str}".strip() for i in md.disasm(code, address)]


# --- disassembly on the six architectures ------------------------------------

@pytest.mark.parametrize("arch", ARCHES)
def test_disassemble_plugin_export(arch):
    image = elfloader.read_image(PREBUILT / f"standalone_{arch}.so")
    vaddr = image.exports[PLUGIN_QUERY]
    code = image.read(vaddr, 16, "test")
    assert disassemble(arch, code, vaddr) == PLUGIN_QUERY_FIRST[arch]
    assert disassemble(arch, code, BASE + vaddr) == PLUGIN_QUERY_FIRST[arch]


@pytest.mark.parametrize("arch", ARCHES)
def test_disassemble_executable_export(arch):
    image = elfloader.read_image(SAMPLES / f"mul_add_{arch}.so")
    vaddr = image.exports[LIBRARY_QUERY]
    text = disassemble(arch, image.read(vaddr, 16, "test"), vaddr)
    assert not text.startswith("(")
    assert re.fullmatch(r"[a-z][a-z0-9.]*( .+)?", text)


def test_disassemble_pc_relative_and_failures():
    # aarch64 `adr x0, .+8` prints the absolute target.
    adr = (0x10000000 | (8 >> 2) << 5).to_bytes(4, "little")
    assert disassemble("aarch64", adr, 0x1000) == "adr x0, 0x1008"
    assert disassemble("arm64", adr, 0x2000) == "adr x0, 0x2008"   # alias
    assert disassemble("x86_64", b"", 0) == "(unreadable)"
    assert disassemble("aarch64", b"\x00\x00", 0) == "(unreadable)"  # too short
    assert disassemble("aarch64", b"\xff\xff\xff\xff", 0) == (
        "(cannot decode: ff ff ff ff)")
    assert disassemble("x86_64", b"\x0f", 0) == "(cannot decode: 0f)"
    # RVV 1.0 decodes (capstone 6), SEW in decimal as RVV assembly writes it
    assert disassemble("riscv64", bytes.fromhex("5777160d"), 0) == (
        "vsetvli a4, a2, e32, m2, ta, ma")
    assert disassemble("riscv32", bytes.fromhex("07640802"), 0) == "vle32.v v8, (a6)"
    assert disassemble("riscv64", bytes.fromhex("87640702"), 0) == "vle32.v v9, (a4)"
    # an OP-V encoding no instruction has: its bytes, and the extension
    assert disassemble("riscv64", bytes.fromhex("d7b16522"), 0) == (
        "(cannot decode: d7 b1 65 22; RVV (vector extension))")
    assert disassemble("riscv64", bytes.fromhex("5777"), 0) == "(unreadable)"
    # F, D and A decode on both widths: fsw, amoadd.d
    assert disassemble("riscv32", bytes.fromhex("27a0e500"), 0) == "fsw fa4, 0(a1)"
    assert disassemble("riscv64", bytes.fromhex("2fb5b500"), 0) == "amoadd.d a0, a1, (a1)"
    # SVE decodes: cnth x9
    assert disassemble("aarch64", bytes.fromhex("e9e36004"), 0) == "cnth x9"
    assert disassemble("riscv32", b"\x01\x00", 0) == "nop"            # RVC
    assert disassemble("x86_32", b"\x48", 0) == "dec eax"
    assert disassemble("x86_64", b"\x48\x89\xc3", 0) == "mov rbx, rax"
    with pytest.raises(ValueError, match="no disassembler"):
        disassemble("mips", b"\0\0\0\0", 0)


def test_module_does_not_import_unicorn():
    code = ("import sys, elfloader.diagnose; "
            "sys.exit('unicorn' in sys.modules or 'capstone' in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- data addresses ---------------------------------------------------------

REGIONS = [
    Region("binding 0", 0x10000, 4096),
    Region("binding 2", 0x20000, 4096),
    Region("local memory", 0x30000, 4096),
    Region("the stack", 0x80000, 0x10000, offsets=False),
    Region("segment 1 (rw-) of kernel.so", 0x90000, 0x2000, offsets=False),
]


@pytest.mark.parametrize("address, text", [
    (0x20000 + 4096, "binding 2 at offset 4096 of 4096 bytes (1 past the end)"),
    (0x20000 + 4100, "binding 2 at offset 4100 of 4096 bytes (5 past the end)"),
    (0x20000 - 4, "binding 2 at offset -4 of 4096 bytes (4 before the start)"),
    (0x20000, "binding 2 at offset 0 of 4096 bytes"),
    (0x30000 + 12, "local memory at offset 12 of 4096 bytes"),
    (0x80000 + 0x800, "the stack"),
    (0x90010, "segment 1 (rw-) of kernel.so"),
    (0xDEADBEEF, "unmapped"),
    (0x20000 + 4096 + diagnose.NEAR_BYTES, "unmapped"),
    (0, "unmapped (null pointer)"),
    (16, "unmapped (16 bytes past a null pointer)"),
])
def test_describe_address(address, text):
    assert describe_address(address, REGIONS) == text


def test_describe_address_prefers_smallest_and_nearest():
    regions = [Region("the stack", 0x1000, 0x10000, offsets=False),
               Region("local memory", 0x2000, 0x100)]
    assert describe_address(0x2010, regions) == "local memory at offset 16 of 256 bytes"
    assert describe_address(0x2100, regions) == "the stack"
    a, b = Region("binding 0", 0x1000, 0x100), Region("binding 1", 0x1180, 0x100)
    assert describe_address(0x1110, [a, b]).startswith("binding 0 at offset 272")
    assert describe_address(0x1170, [a, b]) == ("binding 1 at offset -16 of 256 bytes "
                                                "(16 before the start)")
    assert describe_address(0x1000, []) == "unmapped"


def test_segment_regions():
    image = elfloader.read_image(SAMPLES / "matmul_aarch64.so")
    regions = segment_regions(image, BASE)
    assert [r.start for r in regions] == [BASE + s.vaddr for s in image.segments]
    assert regions[0].name.endswith(" of matmul_aarch64.so")
    assert any(re.fullmatch(r"segment \d+ \(r-x\) of matmul_aarch64\.so", r.name)
               for r in regions)
    code = image.exports[LIBRARY_QUERY]
    assert describe_address(BASE + code, regions).startswith("segment ")


# --- reports ----------------------------------------------------------------

def test_report_format_64():
    report = FaultReport(
        file="kernel.so", arch="aarch64", kind="write to unmapped memory",
        pc=0x7F0000001234, function="matmul_dispatch_0", workgroup=(3, 0, 0),
        symbol="matmul_dispatch_0+0x34", source="matmul.mlir:12",
        instruction="str s0, [x8]", data_address=0xDEADBEEF,
        data_description="unmapped")
    text = report.format(8)
    lines = text.splitlines()
    assert lines[0] == ("kernel.so: aarch64: export matmul_dispatch_0, workgroup "
                        "(3, 0, 0): write to unmapped memory at 0x00000000deadbeef")
    assert lines[1:] == [
        "  pc:           0x00007f0000001234 matmul_dispatch_0+0x34",
        "  instruction:  str s0, [x8]",
        "  data address: 0x00000000deadbeef (unmapped)",
        "  source:       matmul.mlir:12",
    ]
    assert str(report) == text


def test_report_format_32_and_missing_facts():
    report = FaultReport(file="k.so", arch="riscv32", kind="invalid instruction",
                         pc=-4, function="simple_mul_workgroup",
                         function_kind="import")
    text = report.format(4)
    assert text.splitlines() == [
        "k.so: riscv32: import simple_mul_workgroup: invalid instruction at pc 0xfffffffc",
        "  pc:           0xfffffffc (no symbol)",
        "  instruction:  (unreadable)",
        "  source:       (no line information)",
    ]
    assert str(report) == text
    bare = FaultReport(file="k.so", arch="x86_32", kind="read from unmapped memory",
                       pc=0x1000, data_address=(1 << 40) | 0x10)
    assert bare.format(4).splitlines()[0] == (
        "k.so: x86_32: read from unmapped memory at 0x00000010")
    for bad in (0, 2, 32, 64, 16):
        with pytest.raises(ValueError):
            report.format(bad)


@pytest.mark.parametrize("arch", ["x86_64", "arm32"])
def test_fault_report_from_a_loaded_plugin(arch):
    module = elfloader.load(PREBUILT / f"standalone_{arch}.so", backend="emulated",
                            initialize=False)
    try:
        sym = Symbolizer(module.image, module.base)
        pc = module.exports[PLUGIN_QUERY]
        regions = [Region("binding 1", 0x5000_0000, 256)]
        report = fault_report(file="standalone.so", arch=arch,
                              kind="write to unmapped memory", pc=pc,
                              symbolizers=[sym], read=module.backend.read,
                              function="simple_mul_workgroup", function_kind="import",
                              workgroup=(1, 0, 0), data_address=0x5000_0100,
                              regions=regions)
        assert report.symbol == PLUGIN_QUERY
        assert report.instruction == PLUGIN_QUERY_FIRST[arch]
        assert report.data_description == ("binding 1 at offset 256 of 256 bytes "
                                           "(1 past the end)")
        text = report.format(module.arch.pointer_size)
        assert text.startswith("standalone.so: %s: import simple_mul_workgroup, "
                               "workgroup (1, 0, 0): write to unmapped memory at 0x"
                               % arch)
        assert PLUGIN_QUERY_FIRST[arch] in text
        # A data address inside the image is named by its segment.
        inside = fault_report(file="s.so", arch=arch, kind="write to protected memory",
                              pc=pc, symbolizers=[sym], data_address=pc)
        assert re.fullmatch(r"segment \d+ \(r-x\) of standalone_\w+\.so",
                            inside.data_description)
        assert inside.instruction is None
    finally:
        module.close()
        module.backend.close()


def test_fault_report_outside_every_image():
    def unreadable(address, size):
        raise elfloader.BackendError("unmapped", field="read", value=address)

    image = elfloader.read_image(SAMPLES / "matmul_x86_64.so")
    report = fault_report(file="k.so", arch="x86_64", pc=0xDEAD0000,
                          kind="instruction fetch from unmapped memory",
                          symbolizers=[Symbolizer(image, BASE)], read=unreadable)
    assert report.symbol is None and report.source is None
    assert report.instruction == "(unreadable)"
    assert report.data_address is None
    assert "(no symbol)" in report.format(8)


# --- hostile inputs ---------------------------------------------------------

def _sections(data: bytes) -> dict[str, tuple[int, int, int]]:
    """name -> (header offset, sh_offset, sh_size) of a 64- or 32-bit file."""
    elf = ELFFile(io.BytesIO(data))
    hdr_at = elf["e_shoff"]
    return {s.name: (hdr_at + i * elf["e_shentsize"], s["sh_offset"], s["sh_size"])
            for i, s in enumerate(elf.iter_sections())}


def _patch(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


def _check_survives(data: bytes, name="hostile.so"):
    """The patched file still verifies; symbolizing never raises."""
    image = elfloader.ElfImage(data, name)
    sym = Symbolizer(image, BASE)
    section_symbols(image)
    query = image.exports[next(iter(image.exports))]
    for v in (query, query + 4, image.vaddr_min, image.vaddr_max - 1):
        sym.symbolize(BASE + v)
        sym.source_line(BASE + v)
    return image, sym


def test_garbled_section_tables():
    path = SAMPLES / "matmul_x86_64.so"
    data = path.read_bytes()
    secs = _sections(data)
    shoff_field = 0x28   # e_shoff in Elf64_Ehdr
    shnum_field = 0x3C   # e_shnum
    symtab_hdr, _, _ = secs[".symtab"]
    strtab_hdr, strtab_off, strtab_size = secs[".strtab"]
    cases = {
        "table past the end": _patch(data, shoff_field, (len(data) - 8).to_bytes(8, "little")),
        "table offset huge": _patch(data, shoff_field, (1 << 63).to_bytes(8, "little")),
        "too many sections": _patch(data, shnum_field, (0xFFFF).to_bytes(2, "little")),
        "extended count": _patch(data, shnum_field, b"\0\0"),
        "symtab offset past the end": _patch(data, symtab_hdr + 0x18,
                                             (len(data)).to_bytes(8, "little")),
        "symtab size huge": _patch(data, symtab_hdr + 0x20, (1 << 40).to_bytes(8, "little")),
        "symtab entsize wrong": _patch(data, symtab_hdr + 0x38, (7).to_bytes(8, "little")),
        "symtab link out of range": _patch(data, symtab_hdr + 0x28, (999).to_bytes(4, "little")),
        "symtab link to itself": _patch(data, symtab_hdr + 0x28,
                                        (list(secs).index(".symtab")).to_bytes(4, "little")),
        "strtab past the end": _patch(data, strtab_hdr + 0x20, (len(data)).to_bytes(8, "little")),
        "strtab unterminated": _patch(data, strtab_off, b"x" * strtab_size),
        "truncated file": data[:secs[".symtab"][1] + 30],
    }
    query = elfloader.read_image(path).exports[LIBRARY_QUERY]
    for what, bad in cases.items():
        if what == "truncated file":
            # cut inside .symtab: the section table is gone with it
            image = elfloader.ElfImage(bad, what)
            assert section_symbols(image) == [], what
            continue
        image, sym = _check_survives(bad, what)
        names = {s["name"] for s in section_symbols(image)}
        assert "_DYNAMIC" not in names or what == "strtab unterminated", what
        # dynamic symbols still name the export
        assert sym.symbolize(BASE + query + 1) == LIBRARY_QUERY + "+0x1", what


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_section_table_bytes(data):
    raw = (SAMPLES / "matmul_aarch64.so").read_bytes()
    secs = _sections(raw)
    start = min(h for h, _, _ in secs.values())
    end = max(h for h, _, _ in secs.values()) + 64
    count = data.draw(st.integers(1, 16))
    patched = bytearray(raw)
    for _ in range(count):
        at = data.draw(st.integers(start, end - 1))
        patched[at] = data.draw(st.integers(0, 255))
    _check_survives(bytes(patched))


@pytest.fixture(scope="module")
def dwarf_bytes(dwarf_build):
    path, image, kernels = dwarf_build
    return image.data, _sections(image.data), kernels


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_garbage_dwarf(dwarf_bytes, data):
    raw, secs, kernels = dwarf_bytes
    name = data.draw(st.sampled_from([n for n in secs if n.startswith(".debug")]))
    _, off, size = secs[name]
    patched = bytearray(raw)
    if data.draw(st.booleans()):
        patched[off:off + size] = data.draw(st.binary(min_size=size, max_size=size))
    else:
        for _ in range(data.draw(st.integers(1, 8))):
            patched[off + data.draw(st.integers(0, size - 1))] = data.draw(st.integers(0, 255))
    image, sym = _check_survives(bytes(patched))
    for low, high in kernels.values():
        for v in (low, (low + high) // 2 & ~3):
            line = sym.source_line(BASE + v)
            assert line is None or isinstance(line, str)


def test_dwarf_over_the_size_limit_is_ignored(dwarf_build, monkeypatch):
    _, image, kernels = dwarf_build
    low, _ = next(iter(kernels.values()))
    monkeypatch.setattr(diagnose, "MAX_DWARF_BYTES", 16)
    sym = Symbolizer(image, BASE)
    assert sym.source_line(BASE + low + 8) is None
    assert sym.symbolize(BASE + low + 8) is None


def test_compressed_dwarf_size_checked(dwarf_build):
    """A section flagged SHF_COMPRESSED whose header claims a huge size is
    not inflated."""
    path, image, kernels = dwarf_build
    secs = _sections(image.data)
    hdr, off, _ = secs[".debug_line"]
    flags = int.from_bytes(image.data[hdr + 8:hdr + 16], "little") | diagnose.SHF_COMPRESSED
    bad = _patch(image.data, hdr + 8, flags.to_bytes(8, "little"))
    bad = _patch(bad, off, (1).to_bytes(4, "little") + bytes(4) + (1 << 40).to_bytes(8, "little"))
    assert diagnose._dwarf_within_limit(image)
    bad_image, sym = _check_survives(bad)
    assert not diagnose._dwarf_within_limit(bad_image)
    low, _ = next(iter(kernels.values()))
    assert sym.source_line(BASE + low + 8) is None


# --- vector code the emulator cannot run -------------------------------------

VECTOR_C = """\
__attribute__((visibility("default")))
int axpy(float *a, const float *b, long n) {
  for (long i = 0; i < n; i++) a[i] += b[i] * 2.0f;
  return 0;
}
"""


def test_report_names_the_rvv_instruction_not_the_next(tmp_path):
    """unicorn stops after an RVV instruction it cannot run; the report
    shows that instruction, decoded (capstone 6), and notes the pc the CPU
    gave, instead of printing the following instruction."""
    pytest.importorskip("ziglang")
    from hal_cpu.buildtools import zig as zigbuild

    (tmp_path / "axpy.c").write_text(VECTOR_C)
    zig = zigbuild.zig_command()
    zigbuild.run(zig + ["cc", "-target", "riscv64-freestanding-none",
                        "-mcpu=baseline_rv64+v", "-fPIC", "-ffreestanding", "-O2",
                        "-c", "axpy.c", "-o", "axpy.o"], tmp_path)
    zigbuild.run(zig + ["ld.lld", "-nostdlib", "-shared", "-o", "axpy.so",
                        "axpy.o"], tmp_path)
    module = elfloader.load(tmp_path / "axpy.so", backend="emulated",
                            engine="unicorn")
    try:
        be = module.backend
        a, b = be.alloc(4096), be.alloc(4096)
        with pytest.raises(elfloader.EmulationError) as info:
            be.call(module.lookup("axpy"), a, b, 100)
        exc = info.value
        # The error names the extension and the engine that runs it.
        assert "RVV (vector extension), which the unicorn engine does not run" in str(exc)
        assert "qemu" in str(exc)
        assert exc.fault.kind in diagnose.INSTRUCTION_FAULTS
        report = fault_report(
            file="axpy.so", arch="riscv64", kind=exc.fault.what, pc=exc.fault.pc,
            symbolizers=[Symbolizer(module.image, module.base)], read=be.read,
            instruction_fault=True)
        code = be.read(report.pc, 4)
        assert code[0] & 0x7F == 0x57                      # OP-V
        assert report.instruction == diagnose.disassemble("riscv64", code, report.pc)
        assert report.instruction.startswith("vsetvli ")
        assert re.fullmatch(r"vsetvli \w+, \w+, e32, m\w+, t[au], m[au]",
                            report.instruction), report.instruction
        assert report.pc < exc.fault.pc and report.symbol.startswith("axpy+0x")
        assert report.note == (f"the CPU reported pc {exc.fault.pc:#x}, after this "
                               "instruction it could not run")
        text = report.format(8)
        assert "  note:         the CPU reported pc" in text
        # Without the flag (a data fault) the pc stays as reported.
        plain = fault_report(file="axpy.so", arch="riscv64", kind=exc.fault.what,
                             pc=exc.fault.pc, symbolizers=[Symbolizer(module.image,
                                                                module.base)],
                             read=be.read)
        assert plain.pc == exc.fault.pc and plain.note is None
        if qemu_program("riscv64"):
            # The qemu engine runs it: a += 2 * b.
            q = elfloader.load(tmp_path / "axpy.so", backend="emulated",
                               engine="qemu")
            with q.backend as qbe:
                x = np.arange(100, dtype=np.float32)
                y = np.full(100, 0.5, np.float32)
                pa, pb = qbe.alloc(400), qbe.alloc(400)
                qbe.write(pa, x.tobytes())
                qbe.write(pb, y.tobytes())
                assert qbe.call(q.lookup("axpy"), pa, pb, 100) == 0
                got = np.frombuffer(qbe.read(pa, 400), np.float32)
                np.testing.assert_array_equal(got, x + 1.0)
    finally:
        module.close()
        module.backend.close()


def test_instruction_lengths_from_the_architecture_tables():
    from elfloader.diagnose import instruction_length
    assert instruction_length("riscv64", b"\x01\x00", 0) == 2      # c.nop
    assert instruction_length("riscv32", b"\x13\x00\x00\x00", 0) == 4
    assert instruction_length("riscv64", b"\x1f\x00", 0) is None   # 48-bit
    assert instruction_length("aarch64", b"\0\0\0\0", 0) == 4
    assert instruction_length("x86_64", b"\x90", 0) is None        # decoder's
    assert instruction_length("arm32", b"\x00\xbf", 1) == 2        # T16 nop
    assert instruction_length("arm32", b"\xaf\xf3\x00\x80", 1) == 4  # T32 nop.w
    assert instruction_length("arm32", b"\x00\xbf\x00\x00", 0) == 4  # A32


# --- what the reports say more (a build without -g, one array bound twice) ----

def test_source_row_of_a_build_without_g_says_g_gives_lines(c_fixture):
    """The committed plugins are built without -g: the source row says
    that -g gives source lines. A -g build names its line, without it."""
    module = elfloader.load(PREBUILT / "standalone_x86_64.so", backend="emulated",
                            engine="unicorn", initialize=False)
    try:
        pc = module.exports[PLUGIN_QUERY]
        report = fault_report(file="standalone.so", arch="x86_64",
                              kind="write to unmapped memory", pc=pc,
                              symbolizers=[Symbolizer(module.image, module.base)],
                              read=module.backend.read)
    finally:
        module.close()
        module.backend.close()
    assert report.source is None and report.source_note == diagnose.NO_LINE_TABLE
    assert ("  source:       (no line information: built without -g; build with "
            "-g for source lines)") in report.format(8).splitlines()
    image = elfloader.read_image(c_fixture["x86_64"])
    sym = Symbolizer(image, BASE)
    entry = BASE + image.exports["diag_entry"]
    report = fault_report(file="x86_64.so", arch="x86_64", kind="k", pc=entry,
                          symbolizers=[sym])
    assert report.source and report.source_note is None
    assert sym.has_line_table()
    # a pc in no image: nothing to say about a build
    bare = fault_report(file="k.so", arch="x86_64", kind="k", pc=0x1234)
    assert bare.source_note is None
    assert bare.format(8).splitlines()[-1] == "  source:       (no line information)"


def test_one_range_bound_twice_is_named_by_both():
    regions = [Region("binding 0", 0x1000, 400), Region("binding 1", 0x2000, 64),
               Region("binding 2", 0x1000, 400)]
    assert describe_address(0x1004, regions) == (
        "binding 0 and binding 2 at offset 4 of 400 bytes")
    assert describe_address(0x1190, regions) == (
        "binding 0 and binding 2 at offset 400 of 400 bytes (1 past the end)")
    assert describe_address(0x2004, regions) == "binding 1 at offset 4 of 64 bytes"
    assert diagnose.joined_names(["a", "b", "a", "c"]) == "a, b and c"


def test_fields_passing_one_array_are_named_together():
    from hal_cpu.faults import field_names

    class Arr:
        nbytes, address, explicit_name = 4, 0, False
    x, y, named = Arr(), Arr(), Arr()
    named.explicit_name = True
    names = field_names({"src": x, "dst": x, "other": y, "n": 3, "mine": named})
    assert names == {x: "src and dst", y: "other"}


@pytest.mark.parametrize("arch", ["x86_64", "riscv64"])
def test_dispatch_report_names_both_bindings_of_one_array(arch):
    """The same numpy array given as bindings 0 and 1 (one guest range) and
    read past its end: the data address is described from both."""
    import json

    from hal_cpu import BindingOverrunError, Executable
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    kernel = manifest["kernels"]["mul_add"]
    per = kernel["per_arch"][arch]
    a = np.ones(4000, np.float32)
    with Executable(SAMPLES / per["file"], backend="emulated") as exe:
        with pytest.raises(BindingOverrunError) as info:
            exe.dispatch(kernel["export"], tuple(per["workgroup_count"]),
                         [a, a, np.zeros(5003, np.float32)], workers=1)
    text = str(info.value)
    assert ("(binding 0 and binding 1 at offset 16000 of 16000 bytes (1 past "
            "the end, guard page))") in text, text
    assert "source:       (no line information: built without -g" in text
