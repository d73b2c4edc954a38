"""Tests for sample_plugins/: the prebuilt plugin ELFs, their reproducible
build, the plugin ABI as seen from the host (ctypes), and IREE's own tools
running our MLIR samples against our plugins."""

from __future__ import annotations

import ctypes
import importlib.util
import io
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from fatelf.arches import lookup
from hal_cpu.programs import BASE_FLAGS

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_plugins"
PREBUILT = SAMPLES / "prebuilt"


def _load_build_module():
    spec = importlib.util.spec_from_file_location("sample_plugins_build", SAMPLES / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = _load_build_module()

ARCH_NAMES = [a.name for a in build.ARCHES]
VARIANT_NAMES = list(build.VARIANTS)

# name -> (e_machine, elfclass, predicate on e_flags or None)
EXPECTED = {
    "x86_64": ("EM_X86_64", 64, None),
    "aarch64": ("EM_AARCH64", 64, None),
    "riscv64": ("EM_RISCV", 64, lambda f: (f & 0x6) == 0x4),  # double-float ABI
    "x86_32": ("EM_386", 32, None),
    # EABI5, hard-float
    "arm32": ("EM_ARM", 32, lambda f: (f & 0xFF000000) == 0x05000000 and f & 0x400),
    "riscv32": ("EM_RISCV", 32, lambda f: (f & 0x6) == 0x2),  # single-float ABI
}
RELATIVE = {"EM_X86_64": 8, "EM_AARCH64": 1027, "EM_RISCV": 3, "EM_386": 8, "EM_ARM": 23}

IS_X86_64_LINUX = (sys.platform.startswith("linux")
                   and platform.machine().lower() in ("x86_64", "amd64"))


def _fatelf():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        import fatelf
    except ImportError:
        pytest.skip("fatelf package not importable")
    return fatelf


# ---------------------------------------------------------------------------
# (a) the committed prebuilt files
# ---------------------------------------------------------------------------


def _elf_facts(data: bytes):
    elf = ELFFile(io.BytesIO(data))
    undefined, exported, needed, reloc_types = [], [], [], set()
    for section in elf.iter_sections():
        if section.name == ".dynsym":
            for sym in section.iter_symbols():
                if not sym.name:
                    continue
                (undefined if sym["st_shndx"] == "SHN_UNDEF" else exported).append(sym.name)
        if isinstance(section, DynamicSection):
            needed += [t.needed for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
        if isinstance(section, RelocationSection) and section["sh_flags"] & 0x2:  # SHF_ALLOC
            reloc_types |= {r["r_info_type"] for r in section.iter_relocations()}
    return elf, undefined, exported, needed, reloc_types


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_prebuilt_standalone_is_self_contained(variant, arch):
    data = (PREBUILT / f"{variant}_{arch}.so").read_bytes()
    elf, undefined, exported, needed, reloc_types = _elf_facts(data)
    machine, elfclass, flags_ok = EXPECTED[arch]
    assert elf.header["e_type"] == "ET_DYN"
    assert elf.header["e_machine"] == machine
    assert elf.elfclass == elfclass
    assert elf.little_endian
    if flags_ok is not None:
        assert flags_ok(elf.header["e_flags"]), hex(elf.header["e_flags"])
    assert undefined == []
    assert needed == []
    assert exported == ["iree_hal_executable_plugin_query"]
    assert reloc_types <= {RELATIVE[machine]}
    # No interpreter, no TLS, no executable stack.
    kinds = {seg["p_type"] for seg in elf.iter_segments()}
    assert "PT_INTERP" not in kinds and "PT_TLS" not in kinds
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_GNU_STACK":
            assert not seg["p_flags"] & 1
    # Import names it can resolve are in the image; `missing_fn` is not.
    for name in (b"simple_mul_workgroup", b"param_add_workgroup", b"param_scale_workgroup"):
        assert name in data
    assert b"missing_fn" not in data


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_prebuilt_sos_bundles_the_six_objects(variant):
    fatelf = _fatelf()
    bundle = (PREBUILT / f"{variant}.sos").read_bytes()
    assert fatelf.is_fatelf(bundle)
    payloads = fatelf.split(bundle)
    assert sorted(fatelf.FatElf.parse(bundle).arches) == sorted(ARCH_NAMES)
    singles = {(PREBUILT / f"{variant}_{a}.so").read_bytes() for a in ARCH_NAMES}
    assert {elf for _, elf in payloads} == singles
    for arch in ARCH_NAMES:
        assert fatelf.select(bundle, arch) == (PREBUILT / f"{variant}_{arch}.so").read_bytes()


def test_prebuilt_variants_differ():
    for arch in ARCH_NAMES:
        assert (PREBUILT / f"standalone_{arch}.so").read_bytes() != (
            PREBUILT / f"standalone_alt_{arch}.so"
        ).read_bytes()


def test_prebuilt_system_plugin_is_host_library():
    data = (PREBUILT / "system_plugin_x86_64.so").read_bytes()
    elf, undefined, exported, needed, _ = _elf_facts(data)
    assert elf.header["e_type"] == "ET_DYN"
    assert elf.header["e_machine"] == "EM_X86_64"
    assert "iree_hal_executable_plugin_query" in exported
    assert "sample_system_plugin_call_count" in exported
    assert any(n.startswith("libc.so") for n in needed)  # a real system library


# ---------------------------------------------------------------------------
# (b) the build is reproducible
# ---------------------------------------------------------------------------

needs_zig = pytest.mark.skipif(not build.zig_available(), reason="ziglang not importable")


@needs_zig
def test_rebuild_is_byte_identical(tmp_path, monkeypatch):
    # A fresh zig cache so the objects are really recompiled.
    monkeypatch.setenv("ZIG_GLOBAL_CACHE_DIR", str(tmp_path / "zig-cache"))
    first = build.build_standalone(tmp_path / "a")
    second = build.build_standalone(tmp_path / "b")
    assert first.keys() == second.keys()
    assert len(first) == len(ARCH_NAMES) * len(VARIANT_NAMES)
    for name in first:
        assert first[name] == second[name], name
    fat_a = build.build_fat(tmp_path / "a", first)
    fat_b = build.build_fat(tmp_path / "b", second)
    assert fat_a == fat_b
    if build.zig_version() == build.ZIG_VERSION:
        for name, data in {**first, **fat_a}.items():
            assert (PREBUILT / name).read_bytes() == data, f"{name} differs from the committed file"


@pytest.mark.skipif(not IS_X86_64_LINUX, reason="system plugin is built for the x86_64 Linux host")
@pytest.mark.skipif(shutil.which("cc") is None and not build.zig_available(),
                    reason="no C compiler")
def test_system_plugin_rebuild_is_deterministic(tmp_path):
    a = build.build_system(tmp_path / "a")
    b = build.build_system(tmp_path / "b")
    assert a.name == "system_plugin_x86_64.so"
    assert a.read_bytes() == b.read_bytes()


# ---------------------------------------------------------------------------
# The plugin ABI driven directly from the host with ctypes (x86_64 Linux):
# glibc's loader can map the standalone x86_64 object too, since it has no
# dependencies and only RELATIVE relocations.
# ---------------------------------------------------------------------------


class Header(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("description", ctypes.c_char_p),
        ("features", ctypes.c_uint32),
        ("sanitizer", ctypes.c_int32),
        ("reserved", ctypes.c_uint64 * 8),
    ]


CtlFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_void_p))


class Allocator(ctypes.Structure):
    _fields_ = [("self", ctypes.c_void_p), ("ctl", CtlFn)]


class Environment(ctypes.Structure):
    _fields_ = [("host_allocator", Allocator)]


class StringView(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("size", ctypes.c_size_t)]


class StringPair(ctypes.Structure):
    _fields_ = [("key", StringView), ("value", StringView)]


class ResolveParams(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_size_t),
        ("symbol_names", ctypes.POINTER(ctypes.c_char_p)),
        ("out_fn_ptrs", ctypes.POINTER(ctypes.c_void_p)),
        ("out_fn_contexts", ctypes.POINTER(ctypes.c_void_p)),
    ]


LoadFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(Environment), ctypes.c_size_t,
                          ctypes.POINTER(StringPair), ctypes.POINTER(ctypes.c_void_p))
UnloadFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
ResolveFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ResolveParams),
                             ctypes.POINTER(ctypes.c_uint32))
ImportFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class PluginV0(ctypes.Structure):
    _fields_ = [("header", ctypes.POINTER(Header)), ("load", LoadFn), ("unload", UnloadFn),
                ("resolve", ResolveFn)]


class MulParams(ctypes.Structure):
    _fields_ = [
        ("binding0", ctypes.c_void_p), ("binding0_offset", ctypes.c_size_t),
        ("binding1", ctypes.c_void_p), ("binding1_offset", ctypes.c_size_t),
        ("binding2", ctypes.c_void_p), ("binding2_offset", ctypes.c_size_t),
        ("dim", ctypes.c_size_t), ("tid", ctypes.c_size_t),
        ("processor_id", ctypes.c_uint32), ("processor_data", ctypes.c_void_p),
    ]


class UnaryParams(ctypes.Structure):
    _fields_ = [
        ("binding0", ctypes.c_void_p), ("binding0_offset", ctypes.c_size_t),
        ("binding1", ctypes.c_void_p), ("binding1_offset", ctypes.c_size_t),
        ("dim", ctypes.c_size_t), ("tid", ctypes.c_size_t),
    ]


def test_mul_params_layout_matches_iree_lp64():
    # Eight pointer-sized fields, a uint32 padded to 8, then a pointer.
    assert MulParams.processor_id.offset == 64
    assert MulParams.processor_data.offset == 72
    assert ctypes.sizeof(MulParams) == 80


class HostAllocator:
    """A host allocator that records what the plugin allocates and frees."""

    MALLOC, CALLOC, REALLOC, FREE = 0, 1, 2, 3

    def __init__(self):
        self.live: dict[int, ctypes.Array] = {}
        self.log: list[tuple[str, int]] = []
        self.fn = CtlFn(self._ctl)
        self.env = Environment(Allocator(None, self.fn))

    def _ctl(self, self_ptr, command, params, inout_ptr):
        if command in (self.MALLOC, self.CALLOC):
            size = ctypes.cast(params, ctypes.POINTER(ctypes.c_size_t))[0]
            buf = ctypes.create_string_buffer(max(size, 1))
            addr = ctypes.addressof(buf)
            self.live[addr] = buf
            inout_ptr[0] = addr
            self.log.append(("malloc", size))
            return None
        if command == self.FREE:
            addr = inout_ptr[0]
            self.live.pop(addr)
            self.log.append(("free", addr))
            return None
        return 12  # UNIMPLEMENTED


class Plugin:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.query = self.lib.iree_hal_executable_plugin_query
        self.query.restype = ctypes.c_void_p
        self.query.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
        ptr = self.query(1, None)
        assert ptr
        self.v0 = ctypes.cast(ptr, ctypes.POINTER(PluginV0)).contents
        self.header = self.v0.header.contents

    def load(self, allocator: HostAllocator, params: dict[str, str] | None = None):
        items = list((params or {}).items())
        pairs = (StringPair * max(len(items), 1))()
        keep = []
        for i, (k, v) in enumerate(items):
            kb, vb = k.encode() + b"#junk", v.encode() + b"#junk"  # not NUL terminated at size
            keep += [kb, vb]
            pairs[i] = StringPair(StringView(kb, len(k.encode())), StringView(vb, len(v.encode())))
        out_self = ctypes.c_void_p()
        status = self.v0.load(ctypes.byref(allocator.env), len(items), pairs,
                              ctypes.byref(out_self))
        return (status or 0), out_self.value

    def resolve(self, self_ptr, names: list[str]):
        n = len(names)
        c_names = (ctypes.c_char_p * n)(*[s.encode() for s in names])
        fns = (ctypes.c_void_p * n)()
        ctxs = (ctypes.c_void_p * n)()
        params = ResolveParams(n, c_names, fns, ctxs)
        resolution = ctypes.c_uint32(0xFFFF)
        status = self.v0.resolve(self_ptr, ctypes.byref(params), ctypes.byref(resolution))
        return (status or 0), resolution.value, list(fns), list(ctxs)


def _arr(x):
    return x.ctypes.data_as(ctypes.c_void_p)


def _call_mul(fn_ptr, ctx, a, b, out, dim, tid, offsets=(0, 0, 0)):
    p = MulParams(_arr(a), offsets[0], _arr(b), offsets[1], _arr(out), offsets[2], dim, tid, 0,
                  None)
    return ImportFn(fn_ptr)(ctypes.byref(p), ctx, None)


def _call_unary(fn_ptr, ctx, x, out, dim, tid):
    p = UnaryParams(_arr(x), 0, _arr(out), 0, dim, tid)
    return ImportFn(fn_ptr)(ctypes.byref(p), ctx, None)


needs_host = pytest.mark.skipif(not IS_X86_64_LINUX, reason="host is not x86_64 Linux")


@pytest.fixture(scope="module")
def standalone():
    return Plugin(PREBUILT / "standalone_x86_64.so")


@pytest.fixture(scope="module")
def standalone_alt():
    return Plugin(PREBUILT / "standalone_alt_x86_64.so")


@needs_host
def test_standalone_query_header(standalone, standalone_alt):
    h = standalone.header
    assert (h.version, h.name, h.features, h.sanitizer) == (1, b"sample_standalone", 1, 0)
    assert list(h.reserved) == [0] * 8
    assert standalone_alt.header.name == b"sample_standalone_alt"
    assert standalone.query(0, None) is None  # host too old for 0x1
    assert standalone.query(7, None)  # newer hosts still get 0x1


@needs_host
def test_standalone_load_uses_host_allocator(standalone):
    alloc = HostAllocator()
    status, self_ptr = standalone.load(alloc)
    assert status == 0 and self_ptr in alloc.live
    assert [op for op, _ in alloc.log] == ["malloc"]
    standalone.v0.unload(self_ptr)
    assert alloc.live == {} and [op for op, _ in alloc.log] == ["malloc", "free"]


@needs_host
def test_standalone_resolve(standalone):
    alloc = HostAllocator()
    status, self_ptr = standalone.load(alloc)
    names = ["?missing_fn", "param_add_workgroup", "param_scale_workgroup", "simple_mul_workgroup"]
    status, resolution, fns, ctxs = standalone.resolve(self_ptr, names)
    assert status == 0 and resolution == 1  # OK, MISSING_OPTIONAL
    assert fns[0] is None and all(fns[1:])
    assert ctxs[1] == self_ptr and ctxs[2] == self_ptr and ctxs[3] is None
    # All present: no bits.
    assert standalone.resolve(self_ptr, ["?simple_mul_workgroup"])[:2] == (0, 0)
    # A required miss is NOT_FOUND, but what was found is still filled in.
    status, resolution, fns, _ = standalone.resolve(self_ptr,
                                                    ["missing_fn", "simple_mul_workgroup"])
    assert status == 5 and fns[0] is None and fns[1]
    standalone.v0.unload(self_ptr)


@needs_host
def test_standalone_resolve_skips_already_resolved(standalone):
    alloc = HostAllocator()
    _, self_ptr = standalone.load(alloc)
    names = (ctypes.c_char_p * 1)(b"simple_mul_workgroup")
    fns = (ctypes.c_void_p * 1)(0x1234)
    ctxs = (ctypes.c_void_p * 1)(0x5678)
    res = ctypes.c_uint32()
    status = standalone.v0.resolve(self_ptr, ctypes.byref(ResolveParams(1, names, fns, ctxs)),
                                   ctypes.byref(res))
    assert (status or 0) == 0 and fns[0] == 0x1234 and ctxs[0] == 0x5678
    standalone.v0.unload(self_ptr)


@needs_host
@pytest.mark.parametrize("dim", [1, 63, 64, 65, 200])
def test_standalone_simple_mul_tiles(standalone, standalone_alt, dim):
    rng = np.random.default_rng(dim)
    a = rng.standard_normal(dim).astype(np.float32)
    b = rng.standard_normal(dim).astype(np.float32)
    for plugin, extra in ((standalone, 0.0), (standalone_alt, 1000.0)):
        alloc = HostAllocator()
        _, self_ptr = plugin.load(alloc)
        _, _, fns, ctxs = plugin.resolve(self_ptr, ["simple_mul_workgroup"])
        out = np.full(dim, -7.0, np.float32)
        groups = -(-dim // 64)
        # One workgroup only touches its own tile.
        assert _call_mul(fns[0], ctxs[0], a, b, out, dim, 0) == 0
        first = min(dim, 64)
        np.testing.assert_array_equal(out[:first], a[:first] * b[:first] + np.float32(extra))
        assert (out[first:] == -7.0).all()
        for tid in range(1, groups + 1):  # tid == groups is past the end: no-op
            assert _call_mul(fns[0], ctxs[0], a, b, out, dim, tid) == 0
        np.testing.assert_array_equal(out, a * b + np.float32(extra))
        plugin.v0.unload(self_ptr)


@needs_host
def test_standalone_simple_mul_offsets(standalone):
    alloc = HostAllocator()
    _, self_ptr = standalone.load(alloc)
    _, _, fns, ctxs = standalone.resolve(self_ptr, ["simple_mul_workgroup"])
    a = np.arange(20, dtype=np.float32)
    b = np.arange(20, dtype=np.float32) + 100
    out = np.zeros(20, np.float32)
    _call_mul(fns[0], ctxs[0], a, b, out, 10, 0, offsets=(3, 5, 7))
    np.testing.assert_array_equal(out[7:17], a[3:13] * b[5:15])
    assert (out[:7] == 0).all() and (out[17:] == 0).all()
    standalone.v0.unload(self_ptr)


@needs_host
@pytest.mark.parametrize(
    "params, bias, scale",
    [
        ({}, 0.0, 1.0),
        ({"bias": "2.5"}, 2.5, 1.0),
        ({"bias": "-0.125", "scale": "3"}, -0.125, 3.0),
        ({"scale": "1.5e1", "other": "ignored"}, 0.0, 15.0),
        ({"scale": "+.5"}, 0.0, 0.5),
        ({"bias": "12345.678"}, 12345.678, 1.0),
        ({"bias": "7E-3"}, 7e-3, 1.0),
        ({"bias": "1e30"}, 1e30, 1.0),
        ({"bias": "0.000001"}, 1e-6, 1.0),
    ],
)
def test_standalone_load_parameters(standalone, params, bias, scale):
    alloc = HostAllocator()
    status, self_ptr = standalone.load(alloc, params)
    assert status == 0
    _, _, fns, ctxs = standalone.resolve(self_ptr, ["param_add_workgroup", "param_scale_workgroup"])
    x = np.linspace(-3, 3, 70).astype(np.float32)
    out = np.zeros_like(x)
    for tid in range(2):
        _call_unary(fns[0], ctxs[0], x, out, len(x), tid)
    np.testing.assert_allclose(out, x + np.float32(bias), rtol=1e-6)
    for tid in range(2):
        _call_unary(fns[1], ctxs[1], x, out, len(x), tid)
    np.testing.assert_allclose(out, x * np.float32(scale), rtol=1e-6)
    standalone.v0.unload(self_ptr)
    assert alloc.live == {}


@needs_host
@pytest.mark.parametrize("value", ["", "abc", "1.2.3", "1e", "--1", "2.5x", ".", "+"])
def test_standalone_rejects_malformed_parameters(standalone, value):
    alloc = HostAllocator()
    status, self_ptr = standalone.load(alloc, {"bias": value})
    assert status == 3 and self_ptr is None  # INVALID_ARGUMENT, nothing allocated
    assert alloc.live == {} and alloc.log == []


@needs_host
def test_standalone_instances_are_independent(standalone):
    alloc = HostAllocator()
    _, one = standalone.load(alloc, {"bias": "1"})
    _, two = standalone.load(alloc, {"bias": "2"})
    assert one != two
    _, _, fns1, ctx1 = standalone.resolve(one, ["param_add_workgroup"])
    _, _, fns2, ctx2 = standalone.resolve(two, ["param_add_workgroup"])
    x = np.zeros(4, np.float32)
    o1, o2 = np.zeros(4, np.float32), np.zeros(4, np.float32)
    _call_unary(fns1[0], ctx1[0], x, o1, 4, 0)
    _call_unary(fns2[0], ctx2[0], x, o2, 4, 0)
    assert (o1 == 1).all() and (o2 == 2).all()
    standalone.v0.unload(one)
    standalone.v0.unload(two)
    assert alloc.live == {}


@needs_host
def test_system_plugin_abi():
    plugin = Plugin(PREBUILT / "system_plugin_x86_64.so")
    h = plugin.header
    assert (h.version, h.name, h.features) == (1, b"sample_system", 0)
    alloc = HostAllocator()
    status, self_ptr = plugin.load(alloc)
    assert status == 0 and self_ptr and alloc.log == []  # uses libc, not the host allocator
    status, resolution, fns, ctxs = plugin.resolve(self_ptr,
                                                   ["?missing_fn", "system_mul_workgroup"])
    assert (status, resolution) == (0, 1) and fns[0] is None and ctxs[1] == self_ptr
    assert plugin.resolve(self_ptr, ["simple_mul_workgroup"])[0] == 5
    a = np.arange(100, dtype=np.float32)
    b = np.full(100, 0.5, np.float32)
    out = np.zeros(100, np.float32)
    for tid in range(2):
        assert _call_mul(fns[1], ctxs[1], a, b, out, 100, tid) == 0
    np.testing.assert_array_equal(out, a * b)
    count = plugin.lib.sample_system_plugin_call_count
    count.restype, count.argtypes = ctypes.c_ulong, [ctypes.c_void_p]
    assert count(self_ptr) == 2
    plugin.v0.unload(self_ptr)


# ---------------------------------------------------------------------------
# (c) IREE's own tools against our MLIR and plugins
# ---------------------------------------------------------------------------

IREE_COMPILE = shutil.which("iree-compile")
IREE_RUN = shutil.which("iree-run-module")
needs_iree = pytest.mark.skipif(
    not (IREE_COMPILE and IREE_RUN and IS_X86_64_LINUX),
    reason="iree-compile/iree-run-module not available"
)

COMPILE_FLAGS = [*BASE_FLAGS, *lookup("x86_64").iree_flags]


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("vmfb")
    cache = {}

    def compile_(name: str) -> Path:
        if name not in cache:
            out = out_dir / f"{name}.vmfb"
            subprocess.run([IREE_COMPILE, str(SAMPLES / f"{name}.mlir"), *COMPILE_FLAGS,
                            "-o", str(out)], check=True, capture_output=True, text=True)
            cache[name] = out
        return cache[name]

    return compile_


def _run(module: Path, function: str, inputs: list[str], plugins: list[Path | str], outputs=()):
    cmd = [IREE_RUN, "--device=local-sync", f"--module={module}", f"--function={function}"]
    cmd += [f"--input={i}" for i in inputs]
    cmd += [f"--output={o}" for o in outputs]
    cmd += [f"--executable_plugin={p}" for p in plugins]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _parse_f32_result(stdout: str) -> np.ndarray:
    m = re.search(r"^(\d+)xf32=(.*)$", stdout, re.M)
    assert m, stdout
    values = np.array([float(v) for v in m.group(2).split()], np.float32)
    assert len(values) == int(m.group(1))
    return values


SOS = PREBUILT / "standalone.sos"
SOS_ALT = PREBUILT / "standalone_alt.sos"
SYSTEM_SO = PREBUILT / "system_plugin_x86_64.so"


@needs_iree
@pytest.mark.parametrize(
    "plugins, extra",
    [
        ([SOS], 0.0),
        ([SOS_ALT], 1000.0),
        (["embedded:" + str(PREBUILT / "standalone_x86_64.so")], 0.0),
        # Plugins are searched last-registered first.
        ([SOS, SOS_ALT], 1000.0),
        ([SOS_ALT, SOS], 0.0),
    ],
    ids=["sos", "alt_sos", "embedded_single", "sos_then_alt", "alt_then_sos"],
)
def test_iree_runs_standalone_example(vmfb, plugins, extra):
    proc = _run(vmfb("standalone_example"), "mixed_invocation", ["8xf32=2", "8xf32=4"], plugins)
    assert proc.returncode == 0, proc.stderr
    assert "EXEC @mixed_invocation" in proc.stdout
    a, b = np.full(8, 2, np.float32), np.full(8, 4, np.float32)
    np.testing.assert_array_equal(_parse_f32_result(proc.stdout), a * b + np.float32(extra) + b)


@needs_iree
@pytest.mark.parametrize("n", [1, 64, 65, 200])
def test_iree_standalone_example_many_workgroups(vmfb, tmp_path, n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "out.npy"
    proc = _run(vmfb("standalone_example"), "mixed_invocation",
                [f"@{tmp_path / 'a.npy'}", f"@{tmp_path / 'b.npy'}"], [SOS], outputs=[f"@{out}"])
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(np.load(out), a * b + b, rtol=1e-6)


@needs_iree
def test_iree_runs_system_example(vmfb):
    proc = _run(vmfb("system_example"), "mixed_invocation", ["8xf32=2", "8xf32=4"], [SYSTEM_SO])
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(_parse_f32_result(proc.stdout), np.full(8, 12, np.float32))


@needs_iree
def test_iree_missing_required_import_fails(vmfb):
    # The system plugin does not provide simple_mul_workgroup.
    proc = _run(vmfb("standalone_example"), "mixed_invocation", ["8xf32=2", "8xf32=4"], [SYSTEM_SO])
    assert proc.returncode != 0
    proc = _run(vmfb("system_example"), "mixed_invocation", ["8xf32=2", "8xf32=4"], [SOS])
    assert proc.returncode != 0


@needs_iree
def test_iree_optional_import_table(vmfb):
    data = vmfb("optional_import").read_bytes()
    assert b"?missing_fn" in data and b"?simple_mul_workgroup" in data


@needs_iree
@pytest.mark.parametrize(
    "mode, plugins, extra",
    [
        # Neither optional import resolves: the executable still loads.
        (0, [SYSTEM_SO], 0.0),
        (0, [SOS], 0.0),
        (1, [SOS], 0.0),
        (1, [SOS_ALT], 1000.0),
        (1, [SYSTEM_SO, SOS_ALT], 1000.0),
    ],
)
def test_iree_optional_imports(vmfb, mode, plugins, extra):
    proc = _run(vmfb("optional_import"), "optional_mul", ["70xf32=3", "70xf32=5", str(mode)],
                plugins)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(_parse_f32_result(proc.stdout),
                                  np.full(70, 15 + extra, np.float32))


@needs_iree
@pytest.mark.parametrize("function", ["add_bias", "scale"])
def test_iree_param_example_defaults(vmfb, function):
    # iree-run-module passes no load parameters: bias 0 and scale 1.
    x = "100xf32=" + " ".join(str(v) for v in range(100))
    proc = _run(vmfb("param_example"), function, [x], [SOS])
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(_parse_f32_result(proc.stdout), np.arange(100, dtype=np.float32))
