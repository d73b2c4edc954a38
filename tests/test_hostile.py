"""Hostile files: every address the runtime would call or read is checked
against the segment permissions before anything of the file runs, the same
on both backends and on all six architectures, and a refused load leaves
nothing mapped.

Each case edits one field of a bundled sample executable
(``hal_cpu/samples/mul_add_<arch>.so``) the way a corrupt or malicious file
would: the text segment loses its execute permission, the first segment
(dynamic symbols and strings) loses every permission, an initializer
(``DT_INIT``, written over the first dynamic entry) points into data,
read-only data, outside the image or at the top of the address space, or the
query symbol points into writable data.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

import elfloader
import fatelf.arches as A
from elfloader import ElfFormatError
from elfloader.backend.emulated import EmulatedBackend
from elfloader.backend.native import NativeBackend
from hal_cpu import Executable, LibraryError

SAMPLES = Path(__file__).resolve().parents[1] / "hal_cpu" / "samples"
ARCHES = ["x86_64", "aarch64", "riscv64", "x86_32", "arm32", "riscv32"]
DT_INIT = 12
PF_X = 1


def backends(arch: str) -> list[str]:
    host = A.host()
    return ["emulated", "native"] if host is not None and host.name == arch \
        else ["emulated"]


CASES = [(arch, backend) for arch in ARCHES for backend in backends(arch)]


class Sample:
    """The sample's bytes and the file offsets of the fields the cases
    change."""

    def __init__(self, arch: str):
        self.data = (SAMPLES / f"mul_add_{arch}.so").read_bytes()
        f = ELFFile(io.BytesIO(self.data))
        self.word = "<Q" if f.elfclass == 64 else "<I"
        wsize = struct.calcsize(self.word)
        flags_at = 4 if f.elfclass == 64 else 24     # p_flags in Elf_Phdr
        loads = [(i, s) for i, s in enumerate(f.iter_segments())
                 if s["p_type"] == "PT_LOAD"]
        phdr = lambda i: f["e_phoff"] + f["e_phentsize"] * i  # noqa: E731
        self.text_flags = [(phdr(i) + flags_at, s["p_flags"])
                           for i, s in loads if s["p_flags"] & PF_X][0]
        self.first_flags = phdr(loads[0][0]) + flags_at
        self.data_vaddr = [s["p_vaddr"] for _, s in loads if s["p_flags"] & 2][0]
        self.top = (1 << (8 * wsize)) - 1
        self.dynamic = f.get_section_by_name(".dynamic")["sh_offset"]
        self.wsize = wsize
        dynsym = f.get_section_by_name(".dynsym")
        value_at = 8 if f.elfclass == 64 else 4      # st_value in Elf_Sym
        self.query_value = [
            dynsym["sh_offset"] + i * dynsym["sh_entsize"] + value_at
            for i, s in enumerate(dynsym.iter_symbols())
            if s.name == "iree_hal_executable_library_query"][0]

    def patched(self, *edits: tuple[int, str, int]) -> bytes:
        buf = bytearray(self.data)
        for offset, fmt, value in edits:
            struct.pack_into(fmt, buf, offset, value)
        return bytes(buf)

    def with_init(self, target: int) -> bytes:
        """The first dynamic entry (DT_FLAGS) replaced by DT_INIT = target."""
        return self.patched((self.dynamic, self.word, DT_INIT),
                            (self.dynamic + self.wsize, self.word, target))


def make_backend(arch: str, kind: str):
    return NativeBackend() if kind == "native" else \
        EmulatedBackend(elfloader.arch.by_name(arch))


def refused(arch: str, kind: str, blob: bytes, error: type, *words: str):
    """Loading ``blob`` raises ``error`` with ``words`` in its message and
    maps nothing that stays."""
    backend = make_backend(arch, kind)
    try:
        before = backend.mapped_bytes
        with pytest.raises(error) as info:
            Executable(blob, backend=backend)
        for w in words:
            assert w in str(info.value), str(info.value)
        assert backend.mapped_bytes == before
    finally:
        backend.close()


@pytest.mark.parametrize("arch,kind", CASES)
def test_untouched_sample_loads(arch, kind):
    backend = make_backend(arch, kind)
    try:
        with Executable(Sample(arch).data, backend=backend) as exe:
            assert exe.exports
    finally:
        backend.close()


@pytest.mark.parametrize("arch,kind", CASES)
def test_text_segment_without_execute_permission(arch, kind):
    s = Sample(arch)
    offset, flags = s.text_flags
    refused(arch, kind, s.patched((offset, "<I", flags & ~PF_X)), LibraryError,
            "iree_hal_executable_library_query", "not executable")


@pytest.mark.parametrize("arch,kind", CASES)
def test_unreadable_dynamic_tables(arch, kind):
    s = Sample(arch)
    refused(arch, kind, s.patched((s.first_flags, "<I", 0)), ElfFormatError,
            "DT_", "which is not r")


@pytest.mark.parametrize("where", ["data", "rodata", "outside", "top"])
@pytest.mark.parametrize("arch,kind", CASES)
def test_initializer_outside_code(arch, kind, where):
    s = Sample(arch)
    target = {"data": s.data_vaddr + 16, "rodata": 0x40, "outside": 1 << 20,
              "top": s.top}[where]
    words = {"data": ("DT_INIT: ", "which is not x"),
             "rodata": ("DT_INIT: ", "which is not x"),
             "outside": ("DT_INIT: ", "no PT_LOAD segment"),
             "top": ("DT_INIT: ", "no PT_LOAD segment")}[where]
    refused(arch, kind, s.with_init(target), ElfFormatError, *words)


@pytest.mark.parametrize("arch,kind", CASES)
def test_query_symbol_in_writable_data(arch, kind):
    s = Sample(arch)
    refused(arch, kind, s.patched((s.query_value, s.word, s.data_vaddr + 16)),
            LibraryError, "iree_hal_executable_library_query", "not executable")
