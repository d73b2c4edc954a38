"""Loading one verified ELF image into a backend.

The steps follow IREE's platform-agnostic loader
(``runtime/src/iree/hal/local/elf/elf_module.c``): reserve the image's
address range, copy the PT_LOAD segments in (zero-filled past
``p_filesz``), apply the relocations the verified image lists with the
architecture's table, set each page's final protection, and run the
initializers. The image is assembled and relocated in host memory and
copied into the backend once, so both backends share every step. Parsing
and checking belong to :class:`elfloader.image.ElfImage`.
"""

from __future__ import annotations

from fatelf.cstruct import pack_array, unpack_array

from .backend import PROT_EXEC, PROT_NONE, PROT_READ, PROT_WRITE, Backend
from .elf import PF_R, PF_W, PF_X
from .errors import (ArchitectureMismatchError, RelocationError,
                     SymbolNotFoundError, UnsupportedElfError)
from .image import ElfImage


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
            faulted. On any failure nothing stays mapped in the backend.
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
        self._fini: list[int] = []
        page = backend.page_size
        self.size = -(-image.size // page) * page
        self._reservation = backend.reserve(self.size, image.align)
        self.base = self._reservation - image.vaddr_min
        self.lo, self.hi = self._reservation, self._reservation + self.size
        try:
            self._load(initialize)
        except BaseException:
            backend.release(self._reservation)
            self._reservation = None
            raise

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
            self.backend.write(self._reservation + offset, buf)
        for place, data in extra:
            self.backend.write(self._reservation + place, data)
        self._protect()
        mask = self.arch.word_mask
        self.exports = {n: (self.base + v) & mask for n, v in img.exports.items()}
        self._fini = [self.base + v for v in img.finalizers]
        if initialize:
            for vaddr in img.initializers:
                self.backend.call(self.base + vaddr)
        else:
            self._fini = []

    def _relocate(self, pieces) -> list[tuple[int, bytes]]:
        """Apply the relocations to ``pieces`` ((image offset, bytearray)
        of each segment's file-backed bytes); returns the (offset, bytes) of
        those placed outside every piece."""
        img, arch = self.image, self.arch
        vmin, B, ps = img.vaddr_min, self.base, arch.pointer_size
        syms = img.symbols
        extra: dict[int, bytes] = {}
        for r in img.relocations:
            rel = arch.relocations[r.type]
            place = r.offset - vmin
            ctype = "u32" if rel.size == 4 else "u64"
            buf, at = None, 0
            for offset, piece in pieces:
                if offset <= place and place + rel.size <= offset + len(piece):
                    buf, at = piece, place - offset
                    break
            inside = buf is not None
            S = (B + syms[r.symbol]["st_value"]) & arch.word_mask if r.symbol else 0
            if r.addend is None:
                old = (buf[at:at + rel.size] if inside
                       else extra.get(place, bytes(rel.size)))
                A = unpack_array(ctype, ps, old, 0, 1)[0]
            else:
                A = r.addend
            value = rel.formula(S, A, B + r.offset, B)
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
            data = pack_array(ctype, ps, [value])
            if inside:
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
                self.backend.protect(self._reservation + start * page,
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
            for address in self._fini:
                self.backend.call(address)
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
