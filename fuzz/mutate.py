"""Field-aware mutations of ELF images and FatELF bundles.

A mutation is a description and a list of byte operations, applied in order
to the seed:

* ``("set", offset, bytes)``: overwrite bytes (skipped past the end);
* ``("truncate", length)``: cut the file;
* ``("append", bytes)``: add bytes at the end.

Keeping mutations as plain operations makes a case reproducible from its
record alone and lets the minimizer replay any subset of them.

Values come from :func:`interesting`: zero, all ones, sign and width
boundaries, the seed's value plus or minus one and a page, page - 1 and
page + 1, bit flips, huge values, the image limits of :mod:`elfloader.image`,
and, for addresses, the starts, ends and last bytes of the image's segments
and tables (pointers into other segments).
"""

from __future__ import annotations

import random
from typing import Callable

from elfloader.elf import DT, PF_R, PF_W, PF_X, PT_DYNAMIC, PT_GNU_RELRO, PT_LOAD
from elfloader.image import MAX_IMAGE_SIZE, MAX_TABLE_ENTRIES

from .model import ElfModel, FatModel, Field

PAGE = 4096
Op = tuple
Mutation = tuple  # (description, [Op, ...])


def apply(data: bytes, ops) -> bytes:
    """The seed ``data`` with ``ops`` applied in order."""
    buf = bytearray(data)
    for op in ops:
        if op[0] == "set":
            _, off, raw = op
            if 0 <= off and off + len(raw) <= len(buf):
                buf[off:off + len(raw)] = raw
        elif op[0] == "truncate":
            del buf[op[1]:]
        elif op[0] == "append":
            buf += op[1]
    return bytes(buf)


def ops_to_json(ops) -> list:
    return [[op[0], op[1], op[2].hex()] if op[0] == "set" else
            [op[0], op[1].hex()] if op[0] == "append" else list(op) for op in ops]


def ops_from_json(items) -> list:
    out = []
    for item in items:
        if item[0] == "set":
            out.append(("set", item[1], bytes.fromhex(item[2])))
        elif item[0] == "append":
            out.append(("append", bytes.fromhex(item[1])))
        else:
            out.append(tuple(item))
    return out


# --- values ----------------------------------------------------------------------
def _mask(size: int) -> int:
    return (1 << (8 * size)) - 1


def generic_values(value: int, size: int) -> list[int]:
    bits = 8 * size
    mask = _mask(size)
    sign = 1 << (bits - 1)
    vals = [0, 1, 2, 3, 4, 7, 8, 15, 16, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF,
            0x10000, PAGE - 1, PAGE, PAGE + 1, mask, mask - 1, mask - 3, mask - 7,
            sign, sign - 1, sign + 1, value + 1, value - 1, value + PAGE, value - PAGE,
            value + PAGE - 1, value + PAGE + 1, value * 2, value << 4, value << 12,
            value >> 1, value ^ sign, -value]
    if bits >= 32:
        vals += [0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFF - PAGE + 1,
                 MAX_IMAGE_SIZE - 1, MAX_IMAGE_SIZE, MAX_IMAGE_SIZE + 1,
                 MAX_IMAGE_SIZE - PAGE, MAX_TABLE_ENTRIES, MAX_TABLE_ENTRIES + 1]
    if bits >= 64:
        vals += [1 << 32, (1 << 32) + 1, (1 << 32) - 1 + (1 << 32), 1 << 40, 1 << 48,
                 1 << 62, (1 << 63) - PAGE, mask - PAGE + 1, value | (1 << 32),
                 value + (1 << 32), value - (1 << 32)]
    return [v & mask for v in vals]


def interesting(rng: random.Random, f: Field, model: ElfModel | None = None,
                file_size: int | None = None) -> int:
    """A value for field ``f``: by kind (addresses of the image, offsets of
    the file, table sizes...) or generic boundaries, bit flips, random."""
    mask = _mask(f.size)
    r = rng.random()
    if r < 0.12:
        return f.value ^ (1 << rng.randrange(8 * f.size))
    if r < 0.2:
        return rng.getrandbits(8 * f.size)
    if r < 0.55 and model is not None:
        special = kind_values(rng, f, model, file_size)
        if special:
            return rng.choice(special) & mask
    return rng.choice(generic_values(f.value, f.size))


def kind_values(rng, f: Field, model: ElfModel, file_size) -> list[int]:
    img = model.image
    n = file_size if file_size is not None else len(model.data)
    if f.kind in ("vaddr", "code", "data"):
        vals = model.vaddr_values()
        # a pointer into another segment, page-crossing, just before/after
        for lo, hi in (model.segment_ranges(PF_X) if f.kind in ("data", "vaddr")
                       else model.segment_ranges(PF_W) + model.segment_ranges(PF_R)):
            if hi > lo:
                vals += [lo, rng.randrange(lo, hi), hi - 1]
        for lo, hi in model.segment_ranges(PF_X):
            if hi > lo:
                vals += [rng.randrange(lo, hi), lo + 1, hi - 2]
        vals += [f.value + 1, f.value - 1, f.value + 2, f.value + 4, f.value + 8,
                 f.value + PAGE, f.value - PAGE, f.value + 0x10000]
        return vals
    if f.kind == "offset":
        return [0, 1, n, n - 1, n + 1, n - 8, n - 64, n + PAGE, f.value + n,
                f.value + 1, f.value - 1, img.ehdr["e_phoff"], n // 2]
    if f.kind in ("size", "count"):
        v = f.value
        return [0, 1, v + 1, v - 1, v * 2, v + 4, v + 8, v + 12, v + 16, v + 24, v - 8,
                v + PAGE, n, n + 1, MAX_IMAGE_SIZE - PAGE, MAX_IMAGE_SIZE,
                MAX_TABLE_ENTRIES, MAX_TABLE_ENTRIES + 1, 0xFFFF, 0x10000,
                (img.vaddr_max - img.vaddr_min), (1 << 30) - 1, v << 16]
    if f.kind == "flags":
        return [0, PF_R, PF_W, PF_X, PF_R | PF_W, PF_R | PF_X, PF_W | PF_X,
                PF_R | PF_W | PF_X, f.value | PF_X, f.value | PF_W, f.value & ~PF_R, 8,
                0xF0000000]
    if f.kind == "align":
        return [0, 1, 2, 3, 16, PAGE - 1, PAGE, PAGE + 1, 0x10000, 1 << 20, 1 << 29,
                MAX_IMAGE_SIZE, MAX_IMAGE_SIZE << 1, 0x3000]
    if f.kind == "ptype":
        return [0, PT_LOAD, PT_DYNAMIC, 3, 4, 6, 7, PT_GNU_RELRO, 0x6474E551, 0x70000000]
    if f.kind == "tag":
        return list(DT.values()) + [16, 21, 22, 24, 30, 0x6FFFFFFB, 0x6FFFFFF9, -1,
                                    0x7FFFFFFF]
    if f.kind == "info":
        return info_values(rng, f, model)
    if f.kind == "byte":
        return [0, 1, 2, 3, 0x10, 0x11, 0x12, 0x13, 0x20, 0x21, 0x22, 0xFF]
    return []


def info_values(rng, f: Field, model: ElfModel) -> list[int]:
    """``r_info`` values: known and unknown types of the architecture,
    symbol indexes 0, 1, last, one past, huge."""
    img = model.image
    c = img.cls
    nsyms = len(img.symbols)
    types = sorted(img.arch.relocations) + [0, 255, rng.randrange(256)]
    sym_of = c.r_sym(f.value)
    syms = [0, 1, nsyms - 1, nsyms, nsyms + 1, sym_of, 0xFFFFFF]
    out = []
    for _ in range(8):
        t, s = rng.choice(types), rng.choice(syms)
        out.append((s << 8 | (t & 0xFF)) if c.bits == 32 else (s << 32 | t))
    return out


def set_field(f: Field, value: int) -> Op:
    return ("set", f.offset, (value & _mask(f.size)).to_bytes(f.size, "little"))


def _describe(f: Field, value: int) -> str:
    return f"{f.name} {f.value:#x} -> {value & _mask(f.size):#x}"


def field_mutation(rng, f: Field, model, file_size=None, value=None) -> Mutation:
    if value is None:
        value = interesting(rng, f, model, file_size)
        if value & _mask(f.size) == f.value:
            value = f.value ^ (1 << rng.randrange(8 * f.size))
    return _describe(f, value), [set_field(f, value)]


# --- ELF mutators -------------------------------------------------------------------
def m_ehdr(rng, m: ElfModel, n):
    prefer = [f for f in m.ehdr if f.name in ("e_phoff", "e_phnum", "e_phentsize",
                                              "e_ehsize")]
    f = rng.choice(prefer if rng.random() < 0.6 else m.ehdr)
    return field_mutation(rng, f, m, n)


def m_phdr(rng, m: ElfModel, n):
    ph = rng.choice(m.phdrs)
    names = ("p_offset", "p_vaddr", "p_filesz", "p_memsz", "p_flags", "p_align")
    choices = [f for f in ph if f.name.rsplit(".", 1)[1] in names]
    f = rng.choice(choices if rng.random() < 0.85 else ph)
    desc, ops = field_mutation(rng, f, m, n)
    if rng.random() < 0.2:
        # keep filesz <= memsz consistent so the change reaches further stages
        mem = next(x for x in ph if x.name.endswith("p_memsz"))
        fil = next(x for x in ph if x.name.endswith("p_filesz"))
        if f is fil:
            v = int.from_bytes(ops[0][2], "little")
            if v > mem.value:
                ops.append(set_field(mem, v))
                desc += f"; {_describe(mem, v)}"
    return desc, ops


_TARGET_TAGS = ("INIT", "FINI", "INIT_ARRAY", "INIT_ARRAYSZ", "FINI_ARRAY",
                "FINI_ARRAYSZ", "SYMTAB", "STRTAB", "STRSZ", "HASH", "GNU_HASH",
                "RELA", "RELASZ", "REL", "RELSZ", "JMPREL", "PLTRELSZ", "PLTREL",
                "SYMENT", "RELAENT", "RELENT")
#: dynamic entries a mutation may overwrite to add a tag the seed lacks
_SPARE_TAGS = {0x1E, 0x6FFFFFFB, 0x6FFFFFF9, 0x6FFFFFFA, DT["NULL"], DT["RELAENT"],
               DT["RELENT"], DT["SYMENT"]}


def m_dyn_value(rng, m: ElfModel, n):
    entries = [(t, v) for t, v in m.dynamic if t.value in DT.values() and t.value]
    t, v = rng.choice(entries)
    return field_mutation(rng, v, m, n)


def m_dyn_tag(rng, m: ElfModel, n):
    t, v = rng.choice([e for e in m.dynamic if e[0].value] or m.dynamic)
    value = rng.choice(kind_values(rng, t, m, n)) if rng.random() < 0.8 else \
        interesting(rng, t, m, n)
    return field_mutation(rng, t, m, n, value)


def _spare_slots(m: ElfModel) -> list:
    """Dynamic entries the loader does not need (flags, counts, entry sizes,
    DT_NULL padding)."""
    return [e for e in m.dynamic if e[0].value in _SPARE_TAGS]


def inject_values(rng, m: ElfModel, tag: str) -> list[int]:
    img = m.image
    word = img.cls.word
    code = m.segment_ranges(PF_X)
    vals = list(m.vaddr_values())
    for lo, hi in code:
        vals += [lo, hi - 1, hi, rng.randrange(lo, hi), rng.randrange(lo, hi) & ~3]
    vals += list(img.exports.values())
    if tag.endswith("SZ") or tag in ("STRSZ", "RELASZ", "RELSZ", "PLTRELSZ"):
        vals = [0, word, 2 * word, 3, word * 4, word + 1, PAGE, MAX_TABLE_ENTRIES * word,
                (MAX_TABLE_ENTRIES + 1) * word, img.cls.size("rela"), img.cls.size("rel"),
                _mask(word) - word + 1]
    if tag == "PLTREL":
        vals = [DT["RELA"], DT["REL"], 0, 99]
    return vals


def m_dyn_inject(rng, m: ElfModel, n):
    """Add a dynamic tag the seeds do not have (DT_INIT, DT_INIT_ARRAY,
    DT_GNU_HASH, DT_JMPREL, DT_NEEDED...) over a spare entry."""
    slots = _spare_slots(m)
    if not slots:
        return m_dyn_value(rng, m, n)
    groups = [("INIT",), ("FINI",), ("INIT_ARRAY", "INIT_ARRAYSZ"),
              ("FINI_ARRAY", "FINI_ARRAYSZ"), ("GNU_HASH",), ("JMPREL", "PLTRELSZ", "PLTREL"),
              ("NEEDED",), ("REL", "RELSZ"), ("RELA", "RELASZ"), ("TEXTREL",),
              ("INIT", "INIT_ARRAY", "INIT_ARRAYSZ")]
    group = rng.choice(groups)
    rng.shuffle(slots)
    descs, ops = [], []
    img = m.image
    for tag, (t, v) in zip(group, slots):
        tag_no = DT.get(tag, 22)
        if tag == "GNU_HASH":
            # drop DT_HASH so the GNU table is the one read
            for ht, hv in m.dynamic:
                if ht.value == DT["HASH"]:
                    ops.append(set_field(ht, 0x6FFFFFF0))  # DT_VERSYM: ignored
                    descs.append(_describe(ht, 0x6FFFFFF0))
            value = rng.choice(m.vaddr_values() + [img.dynamic[DT["HASH"]][0]])
        elif tag == "INIT_ARRAY" or tag == "FINI_ARRAY":
            # point the array at words already in the image: pointer tables of
            # the IREE structs, the relocation table, data
            cands = [s.vaddr for s in m.sites] + m.vaddr_values()
            value = rng.choice(cands)
        else:
            value = rng.choice(inject_values(rng, m, tag))
        ops.append(set_field(t, tag_no))
        ops.append(set_field(v, value))
        descs.append(f"{t.name} := DT_{tag} {value & _mask(v.size):#x}")
    return "; ".join(descs), ops


def m_dyn_remove(rng, m: ElfModel, n):
    t, v = rng.choice([e for e in m.dynamic if e[0].value])
    return _describe(t, 0) + " (removed/terminated)", [set_field(t, 0)]


def m_symbol(rng, m: ElfModel, n):
    if not m.symbols:
        return m_random_bytes(rng, m, n)
    i = m.query_symbol if m.query_symbol is not None and rng.random() < 0.75 else \
        rng.randrange(len(m.symbols))
    fields = m.symbols[i]
    prefer = [f for f in fields if f.name.endswith("st_value")]
    f = rng.choice(prefer if rng.random() < 0.6 else fields)
    return field_mutation(rng, f, m, n)


def m_relocation(rng, m: ElfModel, n):
    if not m.relocations:
        return m_random_bytes(rng, m, n)
    fields = rng.choice(m.relocations)
    r = rng.random()
    if m.image.arch.rel_tags == "rel" and r < 0.25:
        # implicit addend: the word at the place
        at = m.file_offset(fields[0].value)
        if at is not None:
            size = m.image.cls.word
            value = int.from_bytes(m.data[at:at + size], "little")
            f = Field(f"{fields[0].name}@place", m.base + at, size, value, "vaddr")
            return field_mutation(rng, f, m, n)
    f = rng.choice(fields)
    return field_mutation(rng, f, m, n)


def m_struct_site(rng, m: ElfModel, n):
    """A pointer or count the IREE library/plugin header follows."""
    if not m.sites:
        return m_relocation(rng, m, n)
    site = rng.choice(m.sites)
    desc, ops = field_mutation(rng, site.field, m, n)
    return desc, ops


def m_hash(rng, m: ElfModel, n):
    if not m.hash_words:
        return m_dyn_value(rng, m, n)
    f = rng.choice(m.hash_words[:4] if rng.random() < 0.6 else m.hash_words)
    return field_mutation(rng, f, m, n)


def m_strtab(rng, m: ElfModel, n):
    if not m.strtab:
        return m_random_bytes(rng, m, n)
    off, size = m.strtab
    r = rng.random()
    if r < 0.4:
        # remove every terminator: strings run to the end of the table
        raw = bytes(b if b else 0x41 for b in m.data[off - m.base:off - m.base + size])
        return f"strtab[{off:#x}+{size:#x}] NULs -> 'A'", [("set", off, raw)]
    if r < 0.6:
        return f"strtab[{off:#x}+{size:#x}] -> 0xff", [("set", off, b"\xff" * size)]
    i = rng.randrange(size)
    b = rng.choice([0, 0x41, 0xFF, 0x80, rng.randrange(256)])
    return f"strtab[{i}] -> {b:#x}", [("set", off + i, bytes([b]))]


def m_code(rng, m: ElfModel, n):
    """Bytes of an executable segment (guest code the verifier cannot judge)."""
    if not m.code_ranges:
        return m_random_bytes(rng, m, n)
    off, size = rng.choice(m.code_ranges)
    at = off + rng.randrange(size)
    k = rng.choice([1, 1, 2, 4, 8])
    raw = bytes(rng.randrange(256) for _ in range(k))
    return f"code[{at:#x}] {k} random bytes", [("set", at, raw)]


def m_random_bytes(rng, m, n):
    data_len = n
    k = rng.choice([1, 1, 2, 3, 4, 8, 16])
    ops, where = [], []
    for _ in range(k):
        at = rng.randrange(data_len)
        if rng.random() < 0.5:
            b = rng.randrange(256)
        else:
            b = m.data[at - m.base] ^ (1 << rng.randrange(8)) if 0 <= at - m.base < len(m.data) \
                else rng.randrange(256)
        ops.append(("set", at, bytes([b])))
        where.append(f"{at:#x}")
    return f"{k} random bytes at {','.join(where)}", ops


def m_truncate(rng, m: ElfModel, n):
    img = m.image
    marks = [0, 1, 4, 16, 52, 64, img.ehdr["e_phoff"] + 8,
             img.ehdr["e_phoff"] + img.ehdr["e_phnum"] * img.cls.size("phdr") - 1]
    for s in img.segments:
        marks += [s.offset, s.offset + s.filesz - 1, s.offset + s.filesz // 2]
    length = rng.choice(marks) if rng.random() < 0.6 else rng.randrange(len(m.data))
    length = max(0, min(length, len(m.data) - 1))
    return f"truncate to {length:#x} of {len(m.data):#x}", [("truncate", m.base + length)]


def m_append(rng, m, n):
    k = rng.choice([1, 7, 64, PAGE])
    return f"append {k} bytes", [("append", bytes(rng.randrange(256) for _ in range(k)))]


ELF_MUTATORS: list[tuple[Callable, float]] = [
    (m_ehdr, 6), (m_phdr, 14), (m_dyn_value, 12), (m_dyn_tag, 4), (m_dyn_inject, 10),
    (m_dyn_remove, 2), (m_symbol, 8), (m_relocation, 10), (m_struct_site, 14),
    (m_hash, 4), (m_strtab, 3), (m_code, 3), (m_random_bytes, 8), (m_truncate, 3),
    (m_append, 1),
]


def _pick(rng, table):
    total = sum(w for _, w in table)
    x = rng.random() * total
    for fn, w in table:
        x -= w
        if x < 0:
            return fn
    return table[-1][0]


def mutate_elf(rng: random.Random, model: ElfModel, file_size: int | None = None,
               count: int | None = None) -> list[Mutation]:
    """1 to 3 mutations of one ELF (``model.base`` places it in the file)."""
    if count is None:
        count = rng.choice([1, 1, 1, 1, 2, 2, 3])
    n = file_size if file_size is not None else len(model.data)
    out = []
    for _ in range(count):
        fn = _pick(rng, ELF_MUTATORS)
        if model.base and fn in (m_truncate,):
            fn = m_random_bytes
        desc, ops = fn(rng, model, n)
        out.append((f"{fn.__name__[2:]}: {desc}", ops))
    return out


# --- FatELF mutators ------------------------------------------------------------------
def f_header(rng, fm: FatModel):
    f = rng.choice(fm.header)
    name = f.name.split(".")[1]
    vals = {"magic": [f.value ^ (1 << rng.randrange(32)), 0, 0x7F454C46],
            "version": [0, 2, 0xFFFF, 0x100],
            "record_count": [0, len(fm.records) - 1, len(fm.records) + 1, 255, 1,
                             rng.randrange(256)],
            "reserved": [1, 0x80, 0xFF]}[name]
    return field_mutation(rng, f, None, None, rng.choice(vals))


def f_record(rng, fm: FatModel):
    i = rng.randrange(len(fm.records))
    rec = {f.name.split(".")[1]: f for f in fm.records[i]}
    name = rng.choice(["machine", "osabi", "osabi_version", "word_size", "byte_order",
                       "reserved0", "reserved1", "offset", "offset", "size", "size"])
    f = rec[name]
    n = len(fm.data)
    others = [r for j, r in enumerate(fm.records) if j != i]
    table_end = 8 + 24 * len(fm.records)
    if name == "machine":
        vals = [3, 40, 62, 183, 243, 0, 8, 0xFFFF] + [r[0].value for r in others]
    elif name == "word_size":
        vals = [0, 1, 2, 3, 0xFF]
    elif name == "byte_order":
        vals = [0, 1, 2, 0xFF]
    elif name in ("osabi", "osabi_version"):
        vals = [0, 3, 255, 1, 97]
    elif name.startswith("reserved"):
        vals = [1, 0xFF]
    elif name == "offset":
        vals = [0, 8, table_end - 1, table_end, f.value + 1, f.value - PAGE,
                f.value + PAGE, n, n - PAGE, n + PAGE, 1 << 32, (1 << 64) - PAGE,
                (1 << 63)] + [r[7].value for r in others]
    else:
        end = rec["offset"].value
        vals = [0, 1, 16, 52, 63, 64, f.value - 1, f.value + 1, f.value + PAGE,
                n - end, n - end + 1, 1 << 32, (1 << 64) - 1, (1 << 64) - end,
                f.value // 2] + [r[8].value for r in others]
    return field_mutation(rng, f, None, None, rng.choice(vals))


def f_overlap(rng, fm: FatModel):
    """Two records sharing or overlapping payload bytes."""
    if len(fm.records) < 2:
        return f_record(rng, fm)
    i, j = rng.sample(range(len(fm.records)), 2)
    ri, rj = fm.records[i], fm.records[j]
    r = rng.random()
    if r < 0.35:
        # same bytes twice: record i takes record j's offset and size
        return (f"record[{i}] -> record[{j}]'s payload",
                [set_field(ri[7], rj[7].value), set_field(ri[8], rj[8].value)])
    if r < 0.6:
        # record i grows into record j
        grow = rj[7].value - ri[7].value + rng.choice([1, 64, rj[8].value])
        return (f"record[{i}].size -> {grow:#x} (into record[{j}])",
                [set_field(ri[8], max(grow, 1))])
    if r < 0.8:
        # whole record copied: duplicate target
        raw = fm.data[8 + 24 * j:8 + 24 * j + 24]
        return f"record[{i}] := record[{j}]", [("set", 8 + 24 * i, raw)]
    # swap the payload offsets (each record describes the other's ELF)
    return (f"record[{i}], record[{j}] offsets swapped",
            [set_field(ri[7], rj[7].value), set_field(rj[7], ri[7].value),
             set_field(ri[8], rj[8].value), set_field(rj[8], ri[8].value)])


def f_truncate(rng, fm: FatModel):
    n = len(fm.data)
    table_end = 8 + 24 * len(fm.records)
    marks = [0, 3, 7, 8, table_end - 1, table_end, rng.randrange(n)]
    for f in fm.records:
        off, size = f[7].value, f[8].value
        marks += [off, off + 1, off + size - 1, off + size // 2]
    length = max(0, min(rng.choice(marks), n - 1))
    return f"truncate to {length:#x} of {n:#x}", [("truncate", length)]


def f_payload(rng, fm: FatModel):
    """Field-aware mutations of one record's ELF, in place."""
    i = rng.randrange(len(fm.payloads))
    muts = mutate_elf(rng, fm.payloads[i], len(fm.data))
    return ("; ".join(f"payload[{i}]/{d}" for d, _ in muts),
            [op for _, ops in muts for op in ops])


def f_random(rng, fm: FatModel):
    k = rng.choice([1, 2, 4, 8])
    n = len(fm.data)
    ops = []
    for _ in range(k):
        at = rng.randrange(min(n, 8 + 24 * len(fm.records) + 8) if rng.random() < 0.5 else n)
        ops.append(("set", at, bytes([rng.randrange(256)])))
    return f"{k} random bytes at {','.join(hex(o[1]) for o in ops)}", ops


def f_append(rng, fm):
    k = rng.choice([1, 100, PAGE])
    return f"append {k} bytes", [("append", bytes(rng.randrange(256) for _ in range(k)))]


FAT_MUTATORS = [(f_header, 6), (f_record, 16), (f_overlap, 8), (f_truncate, 5),
                (f_payload, 40), (f_random, 6), (f_append, 2)]


def mutate_fatelf(rng: random.Random, fm: FatModel, count: int | None = None):
    if count is None:
        count = rng.choice([1, 1, 1, 2, 2, 3])
    out = []
    for _ in range(count):
        fn = _pick(rng, FAT_MUTATORS)
        desc, ops = fn(rng, fm)
        out.append((f"{fn.__name__[2:]}: {desc}", ops))
    return out
