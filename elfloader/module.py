"""Loading one verified ELF image into a backend.

The steps follow IREE's platform-agnostic loader
(``runtime/src/iree/hal/local/elf/elf_module.c``): reserve the image's
address range, copy the PT_LOAD segments in (zero-filled past
``p_filesz``), apply the relocations the verified image lists with the
architecture's table, set each page's final protection, and run the
initializers (``DT_INIT``, then ``DT_INIT_ARRAY`` in order; at unload
``DT_FINI_ARRAY`` in reverse, then ``DT_FINI``). The image is assembled
and relocated in host memory and copied into the backend once, so both
backends share every step. Parsing and checking belong to
:class:`elfloader.image.ElfImage`, which also computes each initializer's
address after relocation: the loader calls those verified addresses.

An initializer or finalizer that faults on the emulated backend raises an
:class:`~elfloader.EmulationError` whose message is a debugger-style report
(:func:`elfloader.diagnose.fault_report`): the function (``initializer
DT_INIT_ARRAY[1]``), the symbol and source line of the pc, the instruction,
the data address; it keeps the backend error's fault attributes.
"""

from __future__ import annotations

from fatelf.cstruct import unpack_array

from .backend import PROT_EXEC, PROT_NONE, PROT_READ, PROT_WRITE, Backend
from .elf import PF_R, PF_W, PF_X
from .errors import (
    ArchitectureMismatchError,
    EmulationError,
    RelocationError,
    SymbolNotFoundError,
    UnsupportedElfError,
)
from .image import ElfImage, InitFunction


class ElfModule:
    """An ELF shared object loaded into a backend.

    Args:
        image: a verified :class:`ElfImage`.
        backend: where to load it; its architecture must match the image's.
        initialize: run the initializers (False maps and relocates only:
            nothing of the file runs, for inspection).

    Attributes:
        base: address the image's virtual address 0 maps to (load bias).
        exports: exported (GLOBAL/WEAK, defined) symbol name -> address.
        lo, hi: the loaded image's address range.

    Raises:
        ArchitectureMismatchError: the backend runs another architecture.
        RelocationError: a relocation value does not fit its place.
        UnsupportedElfError: a page would be writable and executable.
        BackendError, EmulationError: mapping failed or an initializer
            faulted (emulated: the message is the fault report, ``report``
            the :class:`~elfloader.diagnose.FaultReport`, ``field`` the
            initializer, e.g. ``DT_INIT_ARRAY[0]``). On any failure nothing
            stays mapped in the backend.
    """

    def __init__(self, image: ElfImage, backend: Backend, *,
                 initialize: bool = True):
        if backend.arch is not image.arch:
            raise ArchitectureMismatchError(
                f"image is {image.arch.name} but the {backend.kind} backend "
                f"runs {backend.arch.name}", name=image.name, field="e_machine",
                value=image.arch.name)
        self.image = image
        self.name = image.name
        self.arch = image.arch
        self.backend = backend
        self._fini: list[InitFunction] = []
        page = backend.page_size
        self.size = -(-image.size // page) * page
        self.lo = backend.reserve(self.size, image.align)
        self._reservation: int | None = self.lo
        self.base = self.lo - image.vaddr_min
        self.hi = self.lo + self.size
        try:
            self._load(initialize)
        except BaseException:
            backend.release(self.lo)
            self._reservation = None
            raise
        backend._add_module(self)  # noqa: SLF001 - the backend's registry

    def _err(self, cls, message, field, value=None):
        return cls(message, name=self.name, field=field, value=value)

    def _load(self, initialize: bool) -> None:
        img = self.image
        # Host memory proportional to the file: one buffer per segment's
        # file-backed bytes; the rest of the reservation (gaps, bss) is zero
        # pages the backend maps lazily, and relocations there are written
        # apart.
        pieces = [(seg.vaddr - img.vaddr_min,
                   bytearray(img.data[seg.offset:seg.offset + seg.filesz]))
                  for seg in img.segments if seg.filesz]
        extra = self._relocate(pieces)
        for offset, buf in pieces:
            self.backend.write(self.lo + offset, buf)
        for place, data in extra:
            self.backend.write(self.lo + place, data)
        self._protect()
        mask = self.arch.word_mask
        self.exports = {n: (self.base + v) & mask for n, v in img.exports.items()}
        if initialize:
            self._check_slots()
            for fn in img.initializers:
                self._run(fn, "initializer")
            self._fini = list(img.finalizers)

    def _check_slots(self) -> None:
        """Every DT_INIT_ARRAY / DT_FINI_ARRAY slot the loader uses holds,
        after relocation, the address the image verified, so what is called
        is what the array holds (as IREE's loader reads it)."""
        img, mask = self.image, self.arch.word_mask
        ps = self.arch.pointer_size
        for fn in img.initializers + img.finalizers:
            if fn.slot is None:
                continue
            raw = self.backend.read(self.base + fn.slot, ps)
            held = unpack_array("ptr", ps, raw)[0]
            want = (self.base + fn.vaddr) & mask
            if held != want:
                raise self._err(RelocationError, f"holds {held:#x} after "
                                f"relocation, not the verified {want:#x}",
                                fn.where, held)

    def _run(self, fn: InitFunction, kind: str) -> None:
        """Call initializer or finalizer ``fn`` (``kind`` says which), its
        fault turned into a report while the module is still mapped."""
        try:
            self.backend.call((self.base + fn.vaddr) & self.arch.word_mask)
        except EmulationError as exc:
            raise self._fault(exc, fn.where, kind) from None

    def _fault(self, exc: EmulationError, where: str,
               kind: str) -> EmulationError:
        """The :class:`EmulationError` for ``exc``, raised by initializer or
        finalizer ``where``: its message is the fault report (the pc's
        symbol and source line in this image, the instruction, the data
        address); ``report`` is the :class:`~elfloader.diagnose.
        FaultReport`, ``field`` ``where``; the backend's ``fault`` (its
        :class:`~elfloader.errors.Fault`) and ``worker`` are kept. ``exc``
        itself when its fault has no pc."""
        fault = exc.fault
        pc = fault.pc if fault is not None else None
        if fault is None or pc is None:
            return exc
        # imported on the first fault: disassembly and DWARF are no part of
        # a run that does not fault
        from .diagnose import (
            INSTRUCTION_FAULTS,
            Region,
            Symbolizer,
            engine_of,
            fault_report,
            time_limit_kind,
        )
        be, arch = self.backend, self.arch
        thumb = arch.disassembly.thumb_modes is not None and bool(pc & 1)
        pc = pc & ~1 if thumb else pc
        if fault.kind == "timeout":
            what, address = time_limit_kind(be.timeout_us / 1e6), None
        else:
            what = fault.what or exc.message
            address = fault.data_address
        regions = [Region("the stack", start, size, offsets=False)
                   for start, size in be.stacks()[:1]]
        report = fault_report(
            file=self.name, arch=arch.name, kind=what, pc=pc,
            symbolizers=[Symbolizer(self.image, self.base)], read=be.read,
            function=where, function_kind=kind, data_address=address,
            regions=regions, thumb=thumb,
            instruction_fault=fault.kind in INSTRUCTION_FAULTS,
            engine=engine_of(be))
        # The report is the whole message: no "name: field:" before it.
        return EmulationError(report.format(arch.pointer_size),
                              name=self.name, field=where, value=pc,
                              fault=fault, report=report, worker=exc.worker,
                              whole_message=True)

    def _relocate(self, pieces) -> list[tuple[int, bytes]]:
        """Apply the relocations to ``pieces`` ((image offset, bytearray)
        of each segment's file-backed bytes); returns the (offset, bytes) of
        those placed outside every piece."""
        img, arch = self.image, self.arch
        vmin, B = img.vaddr_min, self.base
        extra: dict[int, bytes] = {}
        for r in img.relocations:
            rel = arch.relocations[r.type]
            place = r.offset - vmin
            buf: bytearray | None = None
            at = 0
            for offset, piece in pieces:
                if offset <= place and place + rel.size <= offset + len(piece):
                    buf, at = piece, place - offset
                    break
            if r.addend is not None:
                old = b""       # RELA: the place's bytes are not read
            else:
                old = bytes(buf[at:at + rel.size] if buf is not None
                            else extra.get(place, bytes(rel.size)))
            value = img.relocation_value(r, B, old)
            bits = 8 * rel.size
            if rel.check == "signed":
                v = value if value < (1 << 63) else value - (1 << 64)
                ok = -(1 << (bits - 1)) <= v < (1 << (bits - 1))
            else:
                ok = rel.check == "wrap" or 0 <= value < (1 << bits)
            if not ok:
                raise self._err(RelocationError, f"{rel.name} value {value:#x} "
                                f"does not fit a {rel.check} {bits}-bit place",
                                r.where, value)
            # (pack_array's unsigned little-endian bytes, without its lookups)
            data = (value & ((1 << bits) - 1)).to_bytes(rel.size, "little")
            if buf is not None:
                buf[at:at + rel.size] = data
            else:
                extra[place] = data
        return sorted(extra.items())

    def _protect(self) -> None:
        """Final protection of every page: the union of the segments on it,
        read-only under PT_GNU_RELRO, nothing where no segment lies."""
        img, page = self.image, self.backend.page_size
        npages = self.size // page
        prot = [PROT_NONE] * npages
        vmin = img.vaddr_min

        def pages(vaddr, memsz):
            first = (vaddr - vmin) // page
            last = -(-(vaddr + memsz - vmin) // page)
            return range(max(first, 0), min(last, npages))

        for seg in img.segments:
            p = PROT_NONE
            if seg.flags & PF_R:
                p |= PROT_READ
            if seg.flags & PF_W:
                p |= PROT_WRITE | PROT_READ
            if seg.flags & PF_X:
                p |= PROT_EXEC | PROT_READ
            for n in pages(seg.vaddr, seg.memsz):
                prot[n] |= p
                if prot[n] & PROT_WRITE and prot[n] & PROT_EXEC:
                    raise self._err(UnsupportedElfError, "a page would be both "
                                    "writable and executable (segment at "
                                    f"{seg.vaddr:#x})", f"phdr[{seg.index}].p_flags",
                                    seg.flags)
        for vaddr, memsz in img.relro:
            for n in pages(vaddr, memsz):
                prot[n] &= ~PROT_WRITE
        self.page_prot = prot
        start = 0
        for n in range(1, npages + 1):
            if n == npages or prot[n] != prot[start]:
                self.backend.protect(self.lo + start * page,
                                     (n - start) * page, prot[start])
                start = n

    def protection(self, address: int) -> int:
        """PROT_* bits of the page holding ``address`` (PROT_NONE outside)."""
        if not self.lo <= address < self.hi:
            return PROT_NONE
        return self.page_prot[(address - self.lo) // self.backend.page_size]

    # --- public -----------------------------------------------------------
    def lookup(self, symbol: str) -> int:
        """Address of exported ``symbol``.

        Raises:
            SymbolNotFoundError: not exported by this image.
        """
        try:
            return self.exports[symbol]
        except KeyError:
            raise self._err(SymbolNotFoundError, f"exported symbol {symbol!r} "
                            "not found", "dynsym", symbol) from None

    def close(self) -> None:
        """Run finalizers (DT_FINI_ARRAY in reverse, then DT_FINI) and unmap."""
        if self._reservation is None:
            return
        try:
            for fn in self._fini:
                self._run(fn, "finalizer")
        finally:
            self.backend.release(self._reservation)
            self._reservation = None

    @property
    def loaded(self) -> bool:
        return self._reservation is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<ElfModule {self.name} {self.arch.name} at {self.base:#x} "
                f"({self.backend.kind})>")
