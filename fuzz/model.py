"""Where the fields of a seed file lie in its bytes.

:class:`ElfModel` reads one verified ELF image with the project's struct
layer (:mod:`elfloader.elf` layouts, :func:`elfloader.read_image`) and lists,
as :class:`Field` (file offset, width, value), the ELF header fields, every
program header field, every dynamic entry, the dynamic symbols, every
relocation, the hash table words, the string table range and the code
ranges. :class:`FatModel` does the same for a FatELF bundle's header and
records and holds an :class:`ElfModel` for each payload.

:func:`struct_sites` finds the IREE library (or plugin) structs the query
function hands out, by loading the seed (natively for the host
architecture, emulated otherwise) and calling its query once, and
describes each pointer or count field of them by the bytes in the file
that produce it: the ``r_addend`` of the relocation
patching it (RELA), the word at the place (REL, implicit addend), or the raw
word when no relocation touches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import elfloader
import fatelf
from elfloader import elf as elf_structs
from elfloader.elf import DT, PF_X, PT_DYNAMIC
from elfloader.image import ElfImage
from fatelf import format as fatfmt
from fatelf.cstruct import CStruct, sizeof, unpack_array


@dataclass(frozen=True)
class Field:
    """One integer field of the file.

    Attributes:
        name: e.g. ``phdr[2].p_filesz``; offset: absolute file offset;
        size: bytes; value: value in the seed; kind: what the value means
        (``offset``, ``vaddr``, ``code``, ``size``, ``count``, ``flags``,
        ``align``, ``tag``, ``info``, ``int``, ``byte``).
    """
    name: str
    offset: int
    size: int
    value: int
    kind: str = "int"


@dataclass
class StructSite:
    """A field of an IREE ABI struct inside the image, and the file field
    whose value becomes it once loaded.

    Attributes:
        name: e.g. ``library.exports.ptrs[0]``; vaddr: where it lives
        (unbiased); kind: ``code``, ``data`` (pointers) or ``int``;
        field: the file field to mutate; via: ``addend`` (RELA),
        ``place`` (REL implicit addend), ``raw`` (no relocation).
    """
    name: str
    vaddr: int
    kind: str
    field: Field
    via: str


@dataclass
class ElfModel:
    """Field map of one ELF image (``base``: its offset inside the file,
    non-zero for a FatELF payload)."""
    data: bytes
    base: int = 0
    name: str = "<memory>"
    image: ElfImage = None
    ehdr: list = field(default_factory=list)
    phdrs: list = field(default_factory=list)           # [[Field, ...], ...]
    dynamic: list = field(default_factory=list)         # [(tag Field, val Field)]
    symbols: list = field(default_factory=list)         # [[Field, ...], ...]
    query_symbol: int | None = None
    relocations: list = field(default_factory=list)     # [[Field, ...], ...]
    hash_words: list = field(default_factory=list)
    strtab: tuple | None = None                         # (offset, size)
    code_ranges: list = field(default_factory=list)     # [(offset, size)]
    sites: list = field(default_factory=list)           # [StructSite]

    @classmethod
    def build(cls, data: bytes, base: int = 0, name: str = "<memory>") -> "ElfModel":
        m = cls(bytes(data), base, name)
        m.image = img = ElfImage(m.data, name)
        c = img.cls
        ehdr = c.layout("ehdr")
        for fname in ehdr.names:
            if fname == "e_ident":
                continue
            m.ehdr.append(m._field(fname, ehdr.offsets[fname], ehdr, img.ehdr[fname],
                                   _EHDR_KINDS.get(fname, "int")))
        for off, ident in ((4, "EI_CLASS"), (5, "EI_DATA"), (6, "EI_VERSION"),
                           (7, "EI_OSABI")):
            m.ehdr.append(Field(f"e_ident[{ident}]", base + off, 1, m.data[off], "byte"))
        ph = c.layout("phdr")
        for i, p in enumerate(img.phdrs):
            at = img.ehdr["e_phoff"] + i * ph.size
            m.phdrs.append([m._field(f"phdr[{i}].{n}", at + ph.offsets[n], ph, p[n],
                                     _PHDR_KINDS[n]) for n in ph.names])
        dyn_ph = next(p for p in img.phdrs if p["p_type"] == PT_DYNAMIC)
        dl = c.layout("dyn")
        count = dyn_ph["p_filesz"] // dl.size
        for i, e in enumerate(dl.unpack_array(m.data, dyn_ph["p_offset"], count)):
            at = dyn_ph["p_offset"] + i * dl.size
            tag = _DT_NAMES.get(e["d_tag"], f"{e['d_tag']:#x}")
            m.dynamic.append((
                m._field(f"dyn[{i}].d_tag({tag})", at + dl.offsets["d_tag"], dl,
                         e["d_tag"], "tag", "d_tag"),
                m._field(f"dyn[{i}].d_val({tag})", at + dl.offsets["d_val"], dl,
                         e["d_val"], _DT_KINDS.get(tag, "int"), "d_val")))
        sl = c.layout("sym")
        symtab = img.dynamic[DT["SYMTAB"]][0]
        for i, s in enumerate(img.symbols):
            at = m.file_offset(symtab + i * sl.size)
            if at is None:
                break
            m.symbols.append([m._field(f"dynsym[{i}]({s['name']}).{n}", at + sl.offsets[n],
                                       sl, s[n], _SYM_KINDS[n], n) for n in sl.names])
            if s["name"] in (QUERY_LIBRARY, QUERY_PLUGIN):
                m.query_symbol = i
        kind = img.arch.rel_tags
        rl = c.layout(kind)
        for tag, size_tag in ((kind.upper(), kind.upper() + "SZ"), ("JMPREL", "PLTRELSZ")):
            vaddr = img.dynamic.get(DT[tag], [0])[0]
            nbytes = img.dynamic.get(DT[size_tag], [0])[0]
            if not vaddr:
                continue
            at = m.file_offset(vaddr)
            for i in range(nbytes // rl.size):
                r = rl.unpack(m.data, at + i * rl.size)
                m.relocations.append([m._field(f"DT_{tag}[{i}].{n}",
                                               at + i * rl.size + rl.offsets[n], rl, r[n],
                                               _REL_KINDS[n]) for n in rl.names])
        for tag in ("HASH", "GNU_HASH"):
            vaddr = img.dynamic.get(DT[tag], [0])[0]
            at = m.file_offset(vaddr) if vaddr else None
            if at is None:
                continue
            words = 4 if tag == "GNU_HASH" else 2 + 2 * len(img.symbols)
            for i in range(words):
                if base + at + 4 * i + 4 <= base + len(m.data):
                    m.hash_words.append(Field(f"DT_{tag}.word[{i}]", base + at + 4 * i, 4,
                                              int.from_bytes(m.data[at + 4 * i:at + 4 * i + 4],
                                                             "little"), "count"))
        strtab, strsz = img.dynamic[DT["STRTAB"]][0], img.dynamic[DT["STRSZ"]][0]
        at = m.file_offset(strtab)
        if at is not None:
            m.strtab = (base + at, strsz)
        for s in img.segments:
            if s.flags & PF_X and s.filesz:
                m.code_ranges.append((base + s.offset, s.filesz))
        return m

    def _field(self, name, offset, layout, value, kind, member=None) -> Field:
        size = _field_size(layout, member or name.rsplit(".", 1)[-1])
        return Field(name, self.base + offset, size, value, kind)

    # --- addresses --------------------------------------------------------
    def file_offset(self, vaddr: int) -> int | None:
        """Offset (inside this ELF) of the byte the image holds at
        ``vaddr``, or None when it is not backed by the file."""
        for s in self.image.segments:
            if s.vaddr <= vaddr < s.vaddr + s.filesz:
                return s.offset + vaddr - s.vaddr
        return None

    def relocation_at(self, vaddr: int):
        """The relocation fields whose r_offset is ``vaddr``, or None."""
        for fields in self.relocations:
            if fields[0].value == vaddr and self.image.cls.r_type(fields[1].value):
                return fields
        return None

    def vaddr_values(self) -> list[int]:
        """Addresses a hostile file would point at: segment starts, ends and
        last bytes, file-backed ends, gaps, the tables the dynamic section
        names, the image end."""
        img = self.image
        out = {0, img.vaddr_max, img.vaddr_max + 4096, img.vaddr_max - 1}
        for s in img.segments:
            out.update({s.vaddr, s.vaddr - 1, s.end, s.end - 1, s.end - 4, s.end - 8,
                        s.vaddr + s.filesz, s.vaddr + s.filesz - 1, s.end + 4096,
                        (s.vaddr & ~4095) - 1, (s.end + 4095) & ~4095})
        for ph in img.phdrs:
            out.update({ph["p_vaddr"], ph["p_vaddr"] + ph["p_memsz"]})
        for vals in img.dynamic.values():
            for v in vals:
                if 0 < v < img.vaddr_max:
                    out.add(v)
        out.update(img.exports.values())
        return sorted(v & img.arch.word_mask for v in out)

    def segment_ranges(self, flags: int) -> list[tuple[int, int]]:
        return [(s.vaddr, s.end) for s in self.image.segments if s.flags & flags == flags]


QUERY_LIBRARY = "iree_hal_executable_library_query"
QUERY_PLUGIN = "iree_hal_executable_plugin_query"

_DT_NAMES = {v: k for k, v in DT.items()}
_DT_KINDS = {"INIT": "code", "FINI": "code", "INIT_ARRAY": "vaddr", "FINI_ARRAY": "vaddr",
             "INIT_ARRAYSZ": "size", "FINI_ARRAYSZ": "size", "SYMTAB": "vaddr",
             "STRTAB": "vaddr", "STRSZ": "size", "HASH": "vaddr", "GNU_HASH": "vaddr",
             "RELA": "vaddr", "RELASZ": "size", "REL": "vaddr", "RELSZ": "size",
             "JMPREL": "vaddr", "PLTRELSZ": "size", "PLTREL": "tag", "SYMENT": "size",
             "RELENT": "size", "RELAENT": "size", "NEEDED": "int"}
_EHDR_KINDS = {"e_phoff": "offset", "e_shoff": "offset", "e_phnum": "count",
               "e_shnum": "count", "e_entry": "code", "e_phentsize": "size",
               "e_ehsize": "size", "e_shentsize": "size", "e_type": "int",
               "e_machine": "int", "e_version": "int"}
_PHDR_KINDS = {"p_type": "ptype", "p_offset": "offset", "p_vaddr": "vaddr",
               "p_paddr": "vaddr", "p_filesz": "size", "p_memsz": "size",
               "p_flags": "flags", "p_align": "align"}
_SYM_KINDS = {"st_name": "offset", "st_value": "code", "st_size": "size",
              "st_info": "byte", "st_other": "byte", "st_shndx": "int"}
_REL_KINDS = {"r_offset": "vaddr", "r_info": "info", "r_addend": "vaddr"}


def _widths(cstruct, ptr_size: int, prefix: str = "") -> dict[str, int]:
    """Flat field name (nested as ``a.b``) -> element width in bytes."""
    out = {}
    for name, ctype in cstruct.fields:
        if isinstance(ctype, tuple):
            ctype = ctype[0]
        if isinstance(ctype, CStruct):
            out.update(_widths(ctype, ptr_size, f"{prefix}{name}."))
        else:
            out[prefix + name] = sizeof(ctype, ptr_size)
    return out


_STRUCTS: dict[str, CStruct] = {s.name: s for s in (
    elf_structs.EHDR, elf_structs.PHDR32, elf_structs.PHDR64, elf_structs.SYM32,
    elf_structs.SYM64, elf_structs.DYN, elf_structs.REL, elf_structs.RELA,
    fatfmt.FATELF_HEADER, fatfmt.FATELF_RECORD)}


def _field_size(layout, name: str) -> int:
    """Width of field ``name`` of ``layout`` (one element for arrays)."""
    return _widths(_STRUCTS[layout.name], layout.ptr_size)[name]


# --- FatELF --------------------------------------------------------------------
@dataclass
class FatModel:
    """Field map of a FatELF bundle: header, records, payload models."""
    data: bytes
    header: list = field(default_factory=list)
    records: list = field(default_factory=list)         # [[Field, ...], ...]
    payloads: list = field(default_factory=list)        # [ElfModel]
    arches: list = field(default_factory=list)

    @classmethod
    def build(cls, data: bytes, name: str = "<memory>") -> "FatModel":
        m = cls(bytes(data))
        fe = fatelf.FatElf.parse(m.data, name)
        head = fatfmt.HEADER.unpack(m.data, 0)
        for n in fatfmt.HEADER.names:
            m.header.append(Field(f"header.{n}", fatfmt.HEADER.offsets[n],
                                  _field_size(fatfmt.HEADER, n), head[n], "int"))
        for i, raw in enumerate(fatfmt.RECORD.unpack_array(m.data, fatfmt.HEADER_SIZE,
                                                           len(fe.records))):
            at = fatfmt.HEADER_SIZE + i * fatfmt.RECORD_SIZE
            m.records.append([Field(f"record[{i}].{n}", at + fatfmt.RECORD.offsets[n],
                                    _field_size(fatfmt.RECORD, n), raw[n],
                                    {"offset": "offset", "size": "size"}.get(n, "int"))
                              for n in fatfmt.RECORD.names])
        for i, rec in enumerate(fe.records):
            payload = m.data[rec.offset:rec.end]
            m.payloads.append(ElfModel.build(payload, rec.offset, f"{name}[{rec.arch}]"))
            m.arches.append(rec.arch)
        return m


# --- IREE ABI structs ------------------------------------------------------------
def struct_sites(model: ElfModel, kind: str) -> list[StructSite]:
    """The fields of the library (``kind == "executable"``) or plugin
    (``"plugin"``) structs the seed's query function returns, each tied to
    the file field that produces it. Runs the seed's query once, natively
    for the host architecture, emulated otherwise (the seeds are the
    repository's own files)."""
    from hal_cpu import abi
    for s in (abi.LIBRARY_V0, abi.LIBRARY_HEADER, abi.DISPATCH_ATTRS, abi.PLUGIN_V0,
              abi.PLUGIN_HEADER):
        _STRUCTS.setdefault(s.name, s)
    module = elfloader.load(model.data, backend="auto")
    be = module.backend
    try:
        ps, key = be.pointer_size, be.arch.c_abi
        base = module.base
        found: list[tuple[str, int, str, int]] = []   # name, vaddr, kind, size

        def struct(cstruct, address, prefix, kinds):
            layout = cstruct.layout(*key)
            values = layout.unpack(be.read(address, layout.size))
            for n in layout.names:
                k = kinds.get(n, "int")
                if k == "skip":
                    continue
                found.append((f"{prefix}.{n}", address - base + layout.offsets[n], k,
                              _field_size(layout, n)))
            return values

        def array(address, count, prefix, k):
            if not address or not count:
                return []
            values = unpack_array("ptr", ps, be.read(address, ps * count))
            for i in range(count):
                found.append((f"{prefix}[{i}]", address - base + i * ps, k, ps))
            return values

        if kind == "executable":
            env = be.alloc(abi.ENVIRONMENT.layout(*key).size)
            lib_at = be.call(module.lookup(abi.LIBRARY_QUERY), abi.LIBRARY_VERSION, env)
            ptr = {n: "data" for n in ("header", "imports.symbols", "exports.ptrs",
                                       "exports.attrs", "exports.params",
                                       "exports.occupancy", "exports.names",
                                       "exports.tags", "exports.parameter_names",
                                       "exports.source_locations",
                                       "exports.stage_locations", "sources.files")}
            lib = struct(abi.LIBRARY_V0, lib_at, "library", ptr)
            struct(abi.LIBRARY_HEADER, lib["header"], "library.header", {"name": "data"})
            n = lib["exports.count"]
            array(lib["exports.ptrs"], n, "library.exports.ptrs", "code")
            array(lib["exports.names"], n, "library.exports.names", "data")
            array(lib["exports.tags"], n, "library.exports.tags", "data")
            array(lib["imports.symbols"], lib["imports.count"], "library.imports.symbols",
                  "data")
            if lib["exports.attrs"]:
                size = abi.DISPATCH_ATTRS.layout(*key).size
                for i in range(n):
                    struct(abi.DISPATCH_ATTRS, lib["exports.attrs"] + i * size,
                           f"library.exports.attrs[{i}]", {"reserved_1": "skip"})
        else:
            lib_at = be.call(module.lookup(abi.PLUGIN_QUERY), abi.PLUGIN_VERSION, 0)
            lib = struct(abi.PLUGIN_V0, lib_at, "plugin",
                         {"header": "data", "load": "code", "unload": "code",
                          "resolve": "code"})
            struct(abi.PLUGIN_HEADER, lib["header"], "plugin.header",
                   {"name": "data", "description": "data", "reserved": "skip"})
    finally:
        module.close()
        be.close()

    sites = []
    rel_kind = model.image.arch.rel_tags
    for name, vaddr, k, size in found:
        reloc = model.relocation_at(vaddr) if k != "int" else None
        at = model.file_offset(vaddr)
        if reloc is not None and rel_kind == "rela":
            f = reloc[2]
            sites.append(StructSite(name, vaddr, k, Field(f"{name}<-{f.name}", f.offset,
                                                          f.size, f.value, k), "addend"))
        elif at is not None:
            value = int.from_bytes(model.data[at:at + size], "little")
            via = "place" if reloc is not None else "raw"
            sites.append(StructSite(name, vaddr, k, Field(f"{name}@{via}", model.base + at,
                                                          size, value, k), via))
    return sites
