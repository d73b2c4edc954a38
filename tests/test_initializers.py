"""Initializers and finalizers as IREE's loader runs them, on six
architectures, natively where the host allows and emulated on both engines.

``tests/plugins/init_order.c`` (built here with zig and ``-g``) has
``_init`` (DT_INIT), two constructors with priorities (DT_INIT_ARRAY), two
destructors (DT_FINI_ARRAY) and ``_fini`` (DT_FINI), each recording a
number. On the RELA architectures (x86_64, aarch64, riscv64, riscv32) the
array slots hold 0 in the file and the addresses are the addends of
``R_*_RELATIVE`` relocations; on the REL ones (x86_32, arm32) the slots
hold the addresses the relocations add the load bias to. Either way the
loader must run: DT_INIT, the array in order; at unload the finalizer
array in reverse, then DT_FINI, once.

An entry whose value after relocation lies outside every executable
segment is refused before anything is mapped, naming ``DT_INIT_ARRAY[0]``;
an initializer that faults (emulated) raises an ``EmulationError`` whose
message is the fault report: the initializer, the symbol, the source line.
"""

from __future__ import annotations

import io
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

import elfloader
from elfloader import ElfFormatError, EmulationError
from elfloader.backend.emulated import EmulatedBackend
from elfloader.backend.native import NativeBackend
from fatelf import arches

from conftest import emulation_engines

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "plugins" / "init_order.c"
ARCHES = list(arches.RUNTIME_ARCHES)
ENGINES = emulation_engines()
HOST = arches.host()

#: What init_order.c records: initializers into its log, finalizers into
#: the test's sink.
INIT_ORDER = [10, 1, 2]        # _init, constructor(101), constructor(102)
FINI_ORDER = [102, 101, 100]   # destructor(102), destructor(101), _fini


def kinds(arch: str) -> list[str]:
    """Backends to run ``arch`` on: native on the host, both engines."""
    native = ["native"] if HOST is not None and HOST.name == arch else []
    return native + ENGINES


CASES = [(arch, kind) for arch in ARCHES for kind in kinds(arch)]
EMULATED = [(arch, engine) for arch in ARCHES for engine in ENGINES]
#: One backend per architecture, for the cases refused before mapping.
ONE_EACH = [(arch, kinds(arch)[0]) for arch in ARCHES]


def make_backend(arch: str, kind: str):
    if kind == "native":
        return NativeBackend()
    return EmulatedBackend(elfloader.arch.by_name(arch), engine=kind)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """(variant, arch) -> path of init_order.c built with ``-g``; variant
    ``order`` as written, ``fault`` with its faulting constructor."""
    pytest.importorskip("ziglang")
    from hal_cpu.buildtools import zig as zigbuild
    out = tmp_path_factory.mktemp("init_order")
    variants = {"order": [], "fault": ["-DFAULTING_CONSTRUCTOR"]}

    def build(variant: str, arch: str) -> Path:
        data = zigbuild.build_freestanding(
            SOURCE.name, arch, cwd=SOURCE.parent, work_dir=out,
            defines=variants[variant], stem=f"init_{variant}",
            exports=["init_log_count", "init_log_entry", "set_fini_sink"],
            debug=True)
        path = out / f"init_{variant}_{arch}.so"
        path.write_bytes(data)
        return path

    jobs = [(v, a) for v in variants for a in ARCHES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        paths = list(pool.map(lambda job: build(*job), jobs))
    return dict(zip(jobs, paths))


def init_log(module) -> list[int]:
    be = module.backend
    count = elfloader.as_int32(be.call(module.lookup("init_log_count")))
    entry = module.lookup("init_log_entry")
    return [elfloader.as_int32(be.call(entry, i)) for i in range(count)]


def sink_entries(backend, sink: int) -> list[int]:
    words = struct.unpack("<8i", backend.read(sink, 32))
    return list(words[1:1 + words[0]])


# --- the order ------------------------------------------------------------------

@pytest.mark.parametrize("arch,kind", CASES)
def test_order(built, arch, kind):
    """DT_INIT, then DT_INIT_ARRAY in order; at close DT_FINI_ARRAY in
    reverse, then DT_FINI, once; nothing stays mapped."""
    path = built["order", arch]
    image = elfloader.read_image(path)
    assert [f.where for f in image.initializers] == [
        "DT_INIT", "DT_INIT_ARRAY[0]", "DT_INIT_ARRAY[1]"]
    assert [f.where for f in image.finalizers] == [
        "DT_FINI_ARRAY[1]", "DT_FINI_ARRAY[0]", "DT_FINI"]
    backend = make_backend(arch, kind)
    try:
        sink = backend.alloc(32)
        before = backend.mapped_bytes
        module = elfloader.load(image, backend=backend)
        assert init_log(module) == INIT_ORDER
        backend.call(module.lookup("set_fini_sink"), sink)
        assert sink_entries(backend, sink) == []
        module.close()
        assert sink_entries(backend, sink) == FINI_ORDER
        module.close()
        assert sink_entries(backend, sink) == FINI_ORDER
        assert backend.mapped_bytes == before
    finally:
        backend.close()


@pytest.mark.parametrize("arch,kind", ONE_EACH)
def test_not_initialized_runs_nothing(built, arch, kind):
    """initialize=False runs neither initializers nor finalizers."""
    backend = make_backend(arch, kind)
    try:
        sink = backend.alloc(32)
        module = elfloader.load(built["order", arch], backend=backend,
                                initialize=False)
        assert init_log(module) == []
        backend.call(module.lookup("set_fini_sink"), sink)
        module.close()
        assert sink_entries(backend, sink) == []
    finally:
        backend.close()


# --- entries edited --------------------------------------------------------------

class InitArraySlot:
    """Where DT_INIT_ARRAY[0]'s value lives in the file: the stored word
    (REL: the relocation adds the bias to it) or the relocation's addend
    (RELA: the file holds 0 in the slot), and the fields to edit."""

    def __init__(self, path: Path):
        self.data = path.read_bytes()
        f = ELFFile(io.BytesIO(self.data))
        self.word = "<Q" if f.elfclass == 64 else "<I"
        section = f.get_section_by_name(".init_array")
        self.vaddr = section["sh_addr"]
        self.slot_offset = section["sh_offset"]
        self.stored = struct.unpack_from(self.word, self.data, self.slot_offset)[0]
        self.data_vaddr = next(s["p_vaddr"] for s in f.iter_segments()
                               if s["p_type"] == "PT_LOAD" and s["p_flags"] & 2
                               and not s["p_flags"] & 1)
        self.rela = False
        for sec in f.iter_sections():
            if not isinstance(sec, RelocationSection):
                continue
            for i, r in enumerate(sec.iter_relocations()):
                if r["r_offset"] == self.vaddr:
                    self.rela = sec.is_RELA()
                    self.entry = sec["sh_offset"] + i * sec["sh_entsize"]
                    self.info_at = self.entry + struct.calcsize(self.word)
                    self.addend_at = self.entry + 2 * struct.calcsize(self.word)

    def value_at(self) -> tuple[int, str]:
        """File offset and format of the word that gives the entry's value."""
        return ((self.addend_at, self.word) if self.rela
                else (self.slot_offset, self.word))

    def patched(self, *edits: tuple[int, str, int]) -> bytes:
        buf = bytearray(self.data)
        for offset, fmt, value in edits:
            struct.pack_into(fmt, buf, offset, value)
        return bytes(buf)


@pytest.mark.parametrize("arch", ARCHES)
def test_rela_slots_hold_zero(built, arch):
    """The case this is about: on RELA architectures the file holds 0 in
    every slot, and only the relocation gives the constructor."""
    slot = InitArraySlot(built["order", arch])
    rela = elfloader.arch.by_name(arch).rel_tags == "rela"
    assert slot.rela == rela
    assert (slot.stored == 0) == rela
    where, fmt = slot.value_at()
    value = struct.unpack_from(fmt, slot.data, where)[0]
    first = elfloader.read_image(built["order", arch]).initializers[1]
    assert (first.where, first.vaddr, first.slot) == (
        "DT_INIT_ARRAY[0]", value, slot.vaddr)


@pytest.mark.parametrize("where", ["data", "outside"])
@pytest.mark.parametrize("arch,kind", ONE_EACH)
def test_entry_outside_code(built, arch, kind, where):
    """DT_INIT_ARRAY[0] relocated to writable data or past the image: a
    typed error naming the entry and its value; nothing maps or runs."""
    slot = InitArraySlot(built["order", arch])
    target = {"data": slot.data_vaddr + 8, "outside": 1 << 24}[where]
    blob = slot.patched((*slot.value_at(), target))
    words = {"data": "which is not x", "outside": "no PT_LOAD segment"}[where]
    with pytest.raises(ElfFormatError) as info:
        elfloader.read_image(blob)
    err = info.value
    assert err.field == "DT_INIT_ARRAY[0]" and err.value == target
    assert f"DT_INIT_ARRAY[0]: {target:#x}" in str(err) and words in str(err)
    backend = make_backend(arch, kind)
    try:
        before = backend.mapped_bytes
        with pytest.raises(ElfFormatError, match=r"DT_INIT_ARRAY\[0\]"):
            elfloader.load(blob, backend=backend)
        assert backend.mapped_bytes == before
    finally:
        backend.close()


@pytest.mark.parametrize("arch,kind", ONE_EACH)
def test_entry_without_relocation(built, arch, kind):
    """The relocation of DT_INIT_ARRAY[0] made R_*_NONE: the entry is the
    word the file holds. RELA: 0, a terminator, skipped (the second
    constructor still runs); REL: an absolute address, refused."""
    slot = InitArraySlot(built["order", arch])
    blob = slot.patched((slot.info_at, slot.word, 0))   # type 0, symbol 0
    if not slot.rela:
        with pytest.raises(ElfFormatError) as info:
            elfloader.read_image(blob)
        assert info.value.field == "DT_INIT_ARRAY[0]"
        assert info.value.value == slot.stored
        assert "absolute address" in str(info.value)
        return
    image = elfloader.read_image(blob)
    assert [f.where for f in image.initializers] == ["DT_INIT", "DT_INIT_ARRAY[1]"]
    backend = make_backend(arch, kind)
    try:
        with elfloader.load(image, backend=backend) as module:
            assert init_log(module) == [10, 2]
    finally:
        backend.close()


@pytest.mark.parametrize("arch,kind", ONE_EACH)
def test_slot_checked_after_relocation(built, arch, kind):
    """The loader calls an array entry only when the relocated slot holds
    the address the image verified: an image whose list disagrees with the
    relocated array (here edited after verification) is refused before
    anything runs, and nothing stays mapped."""
    image = elfloader.read_image(built["order", arch])
    first = image.initializers[1]
    other = image.initializers[2].vaddr
    image.initializers[1] = type(first)(first.where, other, first.slot)
    backend = make_backend(arch, kind)
    try:
        before = backend.mapped_bytes
        with pytest.raises(elfloader.RelocationError) as info:
            elfloader.load(image, backend=backend)
        assert info.value.field == "DT_INIT_ARRAY[0]"
        assert "not the verified" in str(info.value)
        assert backend.mapped_bytes == before
    finally:
        backend.close()


# --- a faulting initializer --------------------------------------------------------

def _store_line() -> int:
    lines = SOURCE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "*table = 3" in line)


@pytest.mark.parametrize("arch,engine", EMULATED)
def test_faulting_initializer(built, arch, engine):
    """A constructor writing to address 8: the error's message is the
    report naming the initializer, its symbol and source line; the fault
    attributes are kept; nothing stays mapped."""
    path = built["fault", arch]
    backend = make_backend(arch, engine)
    try:
        before = backend.mapped_bytes
        with pytest.raises(EmulationError) as info:
            elfloader.load(path, backend=backend)
        assert backend.mapped_bytes == before
    finally:
        backend.close()
    err = info.value
    text = str(err)
    first = text.splitlines()[0]
    assert first.startswith(f"{path}: {arch}: initializer DT_INIT_ARRAY[2]: "), text
    assert "write" in first and "at 0x" + "0" * (
        2 * arches.lookup(arch).pointer_size - 1) + "8" in first, text
    assert "faulting_constructor" in text, text
    assert f"init_order.c:{_store_line()}" in text, text
    assert "8 bytes past a null pointer" in text, text
    assert f"emulator:     {engine}" in text, text
    assert err.field == "DT_INIT_ARRAY[2]" and err.name == str(path)
    assert err.fault.kind == "write_unmapped" and err.fault.address == 8
    assert err.fault.pc is not None and err.fault.syscall is None
    report = err.report
    assert report.function == "DT_INIT_ARRAY[2]"
    assert report.function_kind == "initializer"
    assert report.symbol.startswith("faulting_constructor")
    assert text == report.format(arches.lookup(arch).pointer_size)
