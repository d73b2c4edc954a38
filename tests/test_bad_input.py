"""Malformed and unsupported inputs: each raises a typed error naming the
problem, never crashes the interpreter, and leaves nothing mapped."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile

import elfloader
from elfloader import (
    ElfError,
    ElfFormatError,
    RelocationError,
    SymbolNotFoundError,
    UnsupportedElfError,
)
from elfloader.backend.emulated import EmulatedBackend
from elfloader.backend.native import NativeBackend
from hal_cpu import DispatchError, Executable, LibraryError
from hal_cpu.programs.vm import plan_program

from conftest import PREBUILT, process_memory


@pytest.fixture
def elf(elementwise_so) -> bytes:
    return elementwise_so.read_bytes()


def phdr_offset(data: bytes, index: int) -> int:
    e_phoff = struct.unpack_from("<Q", data, 0x20)[0]
    return e_phoff + 56 * index


def load_segments(data: bytes) -> list[int]:
    e_phoff, = struct.unpack_from("<Q", data, 0x20)
    e_phnum, = struct.unpack_from("<H", data, 0x38)
    return [i for i in range(e_phnum)
            if struct.unpack_from("<I", data, e_phoff + 56 * i)[0] == 1]


def rela_dyn_offset(data: bytes) -> int:
    import io
    sec = ELFFile(io.BytesIO(data)).get_section_by_name(".rela.dyn")
    return sec["sh_offset"]


def mutate(data: bytes, offset: int, fmt: str, value) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


def expect(data: bytes, error: type, *words: str):
    """Loading ``data`` into fresh native and emulated backends raises
    ``error`` whose message contains ``words``; nothing stays mapped."""
    for backend in (NativeBackend(), EmulatedBackend(elfloader.arch.by_name("x86_64"))):
        before = backend.mapped_bytes
        with pytest.raises(error) as info:
            elfloader.load(data, backend=backend)
        assert isinstance(info.value, ElfError)
        for w in words:
            assert w in str(info.value), str(info.value)
        assert backend.mapped_bytes == before
        backend.close()
    return info.value


def test_good_image_loads_and_unloads(elf):
    backend = NativeBackend()
    module = elfloader.load(elf, backend=backend)
    assert "iree_hal_executable_library_query" in module.exports
    module.close()
    assert backend.mapped_bytes == 0


@pytest.mark.parametrize("size", [0, 3, 15, 40, 63])
def test_truncated_header(elf, size):
    expect(elf[:size], ElfFormatError)


def test_truncated_segments(elf):
    err = expect(elf[:0x500], ElfFormatError)
    assert err.field in ("e_shoff", ) or "outside" in str(err)


def test_wrong_magic(elf):
    expect(b"\x7fELG" + elf[4:], ElfFormatError, "e_ident[EI_MAG]")


def test_big_endian(elf):
    expect(elf[:5] + b"\x02" + elf[6:], UnsupportedElfError, "big-endian")


def test_unknown_class(elf):
    expect(elf[:4] + b"\x07" + elf[5:], UnsupportedElfError, "EI_CLASS", "7")


def test_unsupported_machine(elf):
    err = expect(mutate(elf, 18, "<H", 0x28), UnsupportedElfError, "e_machine",
                 "0x0028")
    assert err.value == 0x28


def test_not_shared_object(elf):
    expect(mutate(elf, 16, "<H", 2), UnsupportedElfError, "e_type", "ET_DYN")


def test_segment_outside_file(elf):
    i = load_segments(elf)[1]
    expect(mutate(elf, phdr_offset(elf, i) + 0x20, "<Q", 0x10_0000),
           ElfFormatError, f"phdr[{i}]", "outside")


def test_overlapping_segments(elf):
    first, second = load_segments(elf)[:2]
    vaddr0 = struct.unpack_from("<Q", elf, phdr_offset(elf, first) + 0x10)[0]
    expect(mutate(elf, phdr_offset(elf, second) + 0x10, "<Q", vaddr0),
           ElfFormatError, "overlap")


def test_absurdly_large_segment(elf):
    i = load_segments(elf)[-1]
    expect(mutate(elf, phdr_offset(elf, i) + 0x28, "<Q", 1 << 44),
           ElfFormatError, "p_memsz", "limit")


def test_relocation_outside_image(elf):
    off = rela_dyn_offset(elf)
    expect(mutate(elf, off, "<Q", 0x7FFF_0000), RelocationError,
           "R_X86_64_RELATIVE", "lies in no PT_LOAD segment", "DT_RELA[0]")


def test_unknown_relocation_type(elf):
    off = rela_dyn_offset(elf)
    expect(mutate(elf, off + 8, "<Q", 0x7F), RelocationError,
           "unknown x86_64 relocation type 127")


def test_relocation_symbol_out_of_range(elf):
    off = rela_dyn_offset(elf)
    expect(mutate(elf, off + 8, "<Q", (999 << 32) | 1), RelocationError,
           "symbol 999")


def test_missing_query_symbol():
    """A plugin is a valid ELF but not an executable library."""
    with pytest.raises(SymbolNotFoundError, match="iree_hal_executable_library_query"):
        Executable(PREBUILT / "standalone_x86_64.so")


def _library_header_file_offset(path) -> int:
    with Executable(path) as exe:
        # Re-run the query to find the header pointer.
        from hal_cpu import abi
        lib = exe.backend.call(exe.module.lookup(abi.LIBRARY_QUERY),
                               abi.LIBRARY_VERSION, exe._env)
        header = exe.view.array("ptr", lib, 1, "library")[0]
        vaddr = header - exe.module.base
    data = path.read_bytes()
    e_phoff, = struct.unpack_from("<Q", data, 0x20)
    for i in load_segments(data):
        p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<4Q", data, e_phoff + 56 * i + 8)
        if p_vaddr <= vaddr < p_vaddr + p_filesz:
            return vaddr - p_vaddr + p_offset
    raise AssertionError("header not in a segment")


def test_wrong_abi_version_in_header(elementwise_so, tmp_path):
    off = _library_header_file_offset(elementwise_so)
    data = elementwise_so.read_bytes()
    assert struct.unpack_from("<I", data, off)[0] == 6
    bad = tmp_path / "v7.so"
    bad.write_bytes(mutate(data, off, "<I", 7))
    backend = NativeBackend()
    with pytest.raises(LibraryError, match="version 0x7"):
        Executable(bad, backend=backend)
    assert backend.mapped_bytes == 0


def test_query_refusing_the_version(elementwise_so, tmp_path):
    """The compiled query compares max_version with 6; make it ask for 7 so
    our version 6 gets NULL, which must name the version asked for."""
    data = bytearray(elementwise_so.read_bytes())
    pos = data.find(bytes.fromhex("83ff06"))  # cmp edi, 6
    assert pos > 0
    data[pos + 2] = 7
    bad = tmp_path / "refuses.so"
    bad.write_bytes(bytes(data))
    for backend in ("native", "emulated"):
        with pytest.raises(LibraryError, match="NULL for version 0x00000006"):
            Executable(bad, backend=backend)


def test_too_few_bindings_or_constants(compiled):
    so = compiled("scale_dyn", "x86_64").so_files[0]
    with Executable(so) as exe:
        exp = exe.exports[0]
        assert exp.binding_count >= 2 and exp.constant_count >= 1
        arrays = [np.zeros(16, np.float32) for _ in range(exp.binding_count)]
        with pytest.raises(DispatchError, match="declares .* bindings"):
            exe.dispatch(0, (1, 1, 1), arrays[:-1], [0] * exp.constant_count)
        with pytest.raises(DispatchError, match="declares .* constants"):
            exe.dispatch(0, (1, 1, 1), arrays, [0] * (exp.constant_count - 1))
        consts = [0] * exp.constant_count
        for kwargs, field in (
                (dict(workgroup_count=(-1, 1, 1)), "workgroup_count.x"),
                (dict(workgroup_count=(1, 1, 65536)), "workgroup_count.z"),
                (dict(workgroup_count=(1 << 32, 1, 1)), "workgroup_count.x"),
                (dict(workgroup_count=(1.9, 1, 1)), "workgroup_count"),
                (dict(workgroup_count=(1, 1)), "workgroup_count"),
                (dict(workgroup_size=(-1, 1, 1)), "workgroup_size.x"),
                (dict(workgroup_size=(0, 1, 1)), "workgroup_size.x"),
                (dict(workers=0), "workers"),
                (dict(constants=[1.7] * exp.constant_count), "constants[0]"),
                (dict(constants=[-1] * exp.constant_count), "constants[0]"),
                (dict(constants=[1 << 32] * exp.constant_count), "constants[0]")):
            args = dict(workgroup_count=(1, 1, 1), bindings=arrays, constants=consts)
            args.update(kwargs)
            with pytest.raises(DispatchError) as info:
                exe.dispatch(0, **args)
            assert info.value.field == field, (kwargs, str(info.value))
            assert info.value.name == exe.path


@pytest.mark.parametrize("backend", ["native", "emulated"])
@pytest.mark.parametrize("position", [0, 1])
def test_binding_that_is_no_buffer_is_typed(compiled, backend, position):
    """A binding that is neither an array nor a buffer is refused with a
    DispatchError naming it, whichever binding it is and whether or not
    the bindings before it were copied."""
    so = compiled("scale_dyn", "x86_64").so_files[0]
    with Executable(so, backend=backend) as exe:
        exp = exe.exports[0]
        arrays = [np.zeros(17, np.float32)[1:] for _ in range(exp.binding_count)]
        arrays[position] = 42
        with pytest.raises(DispatchError) as info:
            exe.dispatch(0, (1, 1, 1), arrays, [0] * exp.constant_count)
        assert info.value.field == f"bindings[{position}]", str(info.value)


def test_dispatch_after_close_is_typed(compiled):
    from hal_cpu import LibraryError
    for backend in ("native", "emulated"):
        exe = Executable(compiled("mul_add", "x86_64").so_files[0], backend=backend)
        exe.close()
        with pytest.raises(LibraryError, match="closed"):
            exe.dispatch(0, (1, 1, 1), [np.zeros(4, np.float32)] * 3)


def test_read_only_bindings_are_never_written(compiled):
    """A kernel writing into a read-only array or ``bytes`` object leaves it
    unchanged on both backends; writable unaligned arrays get the results."""
    c = compiled("mul_add", "x86_64")
    n = 10007
    a = np.arange(n, dtype=np.float32)
    (d,) = plan_program(c, [a, a]).dispatches
    for backend in ("native", "emulated"):
        with Executable(c.so_files[0], backend=backend) as exe:
            out = np.zeros(n, np.float32)
            out.setflags(write=False)
            raw = bytes(4 * n)
            # unaligned writable output: a view 4 bytes into a bigger buffer
            big = np.zeros(n + 16, np.float32)
            unaligned = big[1:n + 1]
            assert unaligned.__array_interface__["data"][0] % 64
            for target in (out, raw):
                exe.dispatch(d.export_name, d.workgroup_count, [a, a, target])
            exe.dispatch(d.export_name, d.workgroup_count, [a, a, unaligned])
            assert not out.any() and raw == bytes(4 * n)
            np.testing.assert_array_equal(unaligned, a * a + a)


def test_zero_size_binding_is_safe(compiled):
    so = compiled("mul_add", "x86_64").so_files[0]
    for backend in ("native", "emulated"):
        with Executable(so, backend=backend) as exe:
            empty = np.zeros(0, np.float32)
            exe.dispatch(0, (0, 1, 1), [empty, empty, empty])


def test_foreign_arch_refused_natively():
    so = PREBUILT / "standalone_aarch64.so"
    with pytest.raises(elfloader.ArchitectureMismatchError, match="emulated"):
        elfloader.load(so, backend="native")


def test_emulated_fault_is_typed(elf):
    backend = EmulatedBackend(elfloader.arch.by_name("x86_64"))
    with pytest.raises(elfloader.EmulationError, match="unmapped"):
        backend.call(0x7000_0000)
    backend.close()


@pytest.mark.parametrize("arch", ["x86_64", "aarch64", "riscv64", "x86_32",
                                  "arm32", "riscv32"])
def test_emulated_dispatch_fault_report(arch):
    """A dispatch function pointer aimed at a non-executable page (as a
    corrupt export table would) faults under emulation with a report naming
    file, architecture, export, workgroup, pc at the guest's word size and
    the instruction."""
    import dataclasses
    path = PREBUILT.parent.parent / "hal_cpu" / "samples" / f"sum_last_{arch}.so"
    with Executable(path, backend="emulated") as exe:
        e = exe.exports[0]
        bad = dataclasses.replace(e, address=exe.module.lo + exe.module.size - 16)
        exe.exports[0] = bad
        exe._export_cache = {0: bad, bad.name: bad}
        with pytest.raises(elfloader.EmulationError) as info:
            exe.dispatch(0, (3, 1, 1), [np.ones((9, 129), np.float32),
                                        np.zeros(9, np.float32)])
    text = str(info.value)
    first = text.splitlines()[0]
    assert first.startswith(f"{path}: {arch}: export {e.name}, workgroup (0, 0, 0)")
    assert "fetch from non-executable memory" in first
    digits = 8 if arch in ("x86_32", "arm32", "riscv32") else 16
    assert f"pc:           0x{exe.module.lo + exe.module.size - 16:0{digits}x}" in text
    assert "instruction:" in text
    assert info.value.fault.kind and info.value.fault.pc


@pytest.mark.parametrize("backend", ["native", "emulated"])
def test_huge_bss_costs_memory_in_proportion_to_the_file(backend):
    """One flipped p_memsz declares a 768 MiB bss in a 5 KB plugin: the load
    maps it lazily instead of building it in host memory."""
    import time as _time
    data = bytearray((PREBUILT / "standalone_x86_64.so").read_bytes())
    e_phoff, = struct.unpack_from("<Q", data, 0x20)
    e_phnum, = struct.unpack_from("<H", data, 0x38)
    last = max((i for i in range(e_phnum)
                if struct.unpack_from("<I", data, e_phoff + 56 * i)[0] == 1),
               key=lambda i: struct.unpack_from("<Q", data, e_phoff + 56 * i + 16)[0])
    struct.pack_into("<Q", data, e_phoff + 56 * last + 40, 0x3000_0000)

    def rss():
        return process_memory()["VmRSS"]
    before, t0 = rss(), _time.perf_counter()
    try:
        module = elfloader.load(bytes(data), backend=backend)
    except ElfError:
        pass
    else:
        module.close()
        module.backend.close()
    assert _time.perf_counter() - t0 < 5
    assert rss() - before < 64 << 20


@pytest.mark.parametrize("backend", ["native", "emulated"])
def test_far_segment_costs_memory_in_proportion_to_the_file(backend):
    """One byte moves a 5 KB plugin's code segment to 0x3f001400: the gap
    before it costs no host memory, and the load fails typed."""
    import resource

    from hal_cpu.plugins import PluginManager
    data = bytearray((PREBUILT / "standalone_x86_64.so").read_bytes())
    data[0xC3] = 0x3F      # phdr[2].p_vaddr 0x1400 -> 0x3f001400
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    from fatelf import PortableKernelError
    with pytest.raises(PortableKernelError):
        with PluginManager("x86_64", backend) as plugins:
            plugins.register_embedded(bytes(data))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 << 10, grown_kib
