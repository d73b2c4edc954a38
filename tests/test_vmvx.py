"""VMVX executables (``vmvx-bytecode-fb``) run on our VM.

Programs of tests/programs/vmvx/ are compiled by the pinned iree-compile
for the vmvx backend (plain bytecode, with microkernels: the ``vmvx``
module's ops, and with data tiling: pack/mmt4d/unpack) and must give what
IREE's own runtime gives for the same file (``local-sync``, which runs
vmvx) and what the llvm-cpu build of the same source gives on our VM.
"""

from __future__ import annotations

import subprocess
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from fatelf import arches
from hal_cpu.cli import main
from hal_cpu.errors import HalCpuError
from hal_cpu.programs import HostModule, compile_program, export
from hal_cpu.programs.compiler import find_iree_compile
from hal_cpu.programs.reference import reference_run
from hal_cpu.programs.vm import VmBuffer, VmStatusError, load_program, vmvx
from hal_cpu.programs.vm.hal_module import HalModule
from hal_cpu.programs.vm.module_def import ModuleFormatError, read_module

PROGRAMS = Path(__file__).parent / "programs" / "vmvx"
HOST = arches.host_arch()
UKERNELS = ("--iree-vmvx-enable-microkernels",)
VARIANTS = {"plain": (), "ukernels": UKERNELS,
            "tiled": UKERNELS + ("--iree-opt-data-tiling",)}


def _inputs(rng, function: str) -> list[np.ndarray]:
    f32 = np.float32
    if function == "float_ops":
        return [rng.uniform(0.5, 4, (4, 8)).astype(f32),
                rng.uniform(0.5, 4, (4, 8)).astype(f32)]
    if function == "int_ops":
        return [rng.integers(-2**31, 2**31, (4, 8), dtype=np.int32),
                rng.integers(-2**31, 2**31, (4, 8), dtype=np.int32)]
    if function == "ctlz_concat":
        a = rng.integers(-2**31, 2**31, (4, 8), dtype=np.int32)
        a >>= rng.integers(0, 32, (4, 8)).astype(np.int32)
        a[0, :3] = (0, 1, -1)
        return [a, rng.integers(-9, 9, (4, 8), dtype=np.int32)]
    if function == "matmul":
        return [rng.standard_normal((8, 16)).astype(f32),
                rng.standard_normal((16, 4)).astype(f32)]
    if function == "matmul_odd":
        return [rng.standard_normal((7, 13)).astype(f32),
                rng.standard_normal((13, 5)).astype(f32)]
    if function == "matmul_i8":
        return [rng.integers(-128, 128, (6, 10), dtype=np.int8),
                rng.integers(-128, 128, (10, 3), dtype=np.int8)]
    if function == "big_mul_add":       # 938 workgroups
        return [rng.standard_normal((200, 300)).astype(f32),
                rng.standard_normal((200, 300)).astype(f32)]
    if function == "matmul_big":
        return [rng.standard_normal((96, 64)).astype(f32),
                rng.standard_normal((64, 80)).astype(f32)]
    if function == "row_sum":
        return [rng.standard_normal((5, 12)).astype(f32)]
    if function == "col_max":
        return [rng.integers(-2**31, 2**31, (6, 9), dtype=np.int32)]
    if function == "softmax":
        return [rng.standard_normal((3, 16)).astype(f32)]
    raise KeyError(function)


CASES = [("elementwise", f, v) for f in ("float_ops", "int_ops", "ctlz_concat",
                                         "big_mul_add") for v in VARIANTS] + \
        [("matmul", f, v) for f in ("matmul", "matmul_odd", "matmul_i8")
         for v in VARIANTS] + \
        [("matmul", "matmul_big", "tiled")] + \
        [("reduce", f, v) for f in ("row_sum", "col_max", "softmax") for v in VARIANTS]


@pytest.fixture(scope="module")
def vmvx_build(tmp_path_factory):
    """``build(stem, variant)``: the program compiled for vmvx only, cached
    for the module."""
    root = tmp_path_factory.mktemp("vmvx")
    done: dict[tuple, Path] = {}

    def build(stem: str, variant: str = "plain") -> Path:
        key = (stem, variant)
        if key not in done:
            out = root / f"{stem}-{variant}.vmfb"
            subprocess.run([str(find_iree_compile()), str(PROGRAMS / f"{stem}.mlir"),
                            "-o", str(out), "--iree-hal-target-backends=vmvx",
                            *VARIANTS[variant]],
                           check=True, capture_output=True, timeout=600)
            done[key] = out
        return done[key]
    return build


def _vmvx_imports(vmfb: Path) -> set[str]:
    with zipfile.ZipFile(vmfb) as z:
        return {i.name for n in z.namelist() if n.endswith("_vmvx_bytecode_fb.fb")
                for i in read_module(z.read(n), name=n).imports}


def _same(got, want, dtype) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if np.issubdtype(dtype, np.floating):
        # (sums in another order: an error relative to the largest value)
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=4e-6 * scale)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("stem,function,variant", CASES)
def test_matches_iree_runtime_and_llvm_cpu(vmvx_build, compile_cache, stem,
                                           function, variant):
    vmfb = vmvx_build(stem, variant)
    inputs = _inputs(np.random.default_rng(zlib.crc32(function.encode())), function)
    trace: list = []
    with load_program(vmfb, trace=trace) as prog:
        got = prog(function, *inputs)
    assert trace and {d.executable.format for d in trace} == {vmvx.VMVX_FORMAT}
    peer = reference_run(vmfb, function, inputs, driver="local-sync")
    native = compile_program(PROGRAMS / f"{stem}.mlir", HOST, compile_cache)
    with load_program(native.vmfb) as prog:
        elf = prog(function, *inputs)
    assert len(got) == len(peer) == len(elf)
    for g, p, e in zip(got, peer, elf):
        _same(g, p, p.dtype)
        _same(g, e, e.dtype)
    if function == "big_mul_add":
        assert trace[0].grid[0] > 1


def test_microkernel_builds_call_the_vmvx_ops(vmvx_build):
    ops = set().union(*(_vmvx_imports(vmvx_build(stem, v)) for stem in
                        ("elementwise", "matmul", "reduce") for v in ("ukernels", "tiled")))
    want = {"vmvx." + n for n in (
        "add.2d.f32", "sub.2d.f32", "mul.2d.f32", "div.2d.f32", "abs.2d.f32",
        "neg.2d.f32", "exp.2d.f32", "log.2d.f32", "rsqrt.2d.f32", "floor.2d.f32",
        "ceil.2d.f32", "add.2d.i32", "mul.2d.i32", "and.2d.i32", "or.2d.i32",
        "xor.2d.i32", "shl.2d.i32", "shrs.2d.i32", "divs.2d.i32", "divu.2d.i32",
        "ctlz.2d.i32", "fill.2d.x32", "mmt4d", "pack", "unpack")}
    assert want <= ops
    assert _vmvx_imports(vmvx_build("elementwise", "plain")) == set()


class Stats(HostModule):
    """The test's host module: ``stats.scale`` triples a tensor."""
    name = "stats"

    @export("scale")
    def scale(self, tensor):
        return np.asarray(tensor) * np.float32(3)


@pytest.mark.parametrize("variant", ["plain", "ukernels"])
def test_host_module_call_between_vmvx_dispatches(vmvx_build, compile_cache, variant):
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    want = (x + x) * 3 * x + np.exp(x)
    with load_program(vmvx_build("host_call", variant), host_modules=[Stats()]) as p:
        (got,) = p("main", x)
    np.testing.assert_allclose(got, want, rtol=2e-6)
    native = compile_program(PROGRAMS / "host_call.mlir", HOST, compile_cache)
    with load_program(native.vmfb, host_modules=[Stats()]) as p:
        (elf,) = p("main", x)
    np.testing.assert_allclose(got, elf, rtol=2e-6)


def test_llvm_cpu_and_vmvx_side_by_side(compile_cache):
    """One .vmfb with both variants (executables unlinked: iree-compile 3.13
    drops the vmvx variant of linked executables): the host's ELF runs
    when the architecture is this machine's, the vmvx one otherwise."""
    other = "riscv64" if HOST != "riscv64" else "aarch64"
    flags = ["--iree-hal-local-target-device-backends=vmvx",
             "--iree-hal-link-executables=false"]
    x = np.random.default_rng(1).standard_normal((5, 12)).astype(np.float32)
    for arch, fmt in ((HOST, arches.lookup(HOST).iree_format), (other, vmvx.VMVX_FORMAT)):
        both = compile_program(PROGRAMS / "reduce.mlir", arch, compile_cache,
                               extra_flags=flags)
        with zipfile.ZipFile(both.vmfb) as z:
            names = z.namelist()
        assert any(n.endswith(".so") for n in names)
        assert any(n.endswith("_vmvx_bytecode_fb.fb") for n in names)
        trace: list = []
        with load_program(both.vmfb, arch=HOST, trace=trace) as p:
            (got,) = p("row_sum", x)
        assert {d.executable.format for d in trace} == {fmt}
        np.testing.assert_allclose(got, x.sum(axis=1), rtol=1e-5, atol=1e-6)


def test_inspect_lists_vmvx_executables(vmvx_build, capsys):
    rc = main(["inspect", str(vmvx_build("matmul", "tiled"))])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "format:       vmvx-bytecode-fb" in out
    assert "vmvx.mmt4d 0rIIrIIrIIIIIiiii_v" in out
    assert "matmul_dispatch" in out and "bindings=" in out


# ---------------------------------------------------------------------------
# hostile input


def _executable_bytes(vmfb: Path) -> bytes:
    with zipfile.ZipFile(vmfb) as z:
        (name,) = [n for n in z.namelist() if n.endswith("_vmvx_bytecode_fb.fb")]
        return z.read(name)


@pytest.mark.parametrize("variant,error", [("plain", VmStatusError),
                                           ("ukernels", vmvx.VmvxAccessError)])
def test_short_binding_is_a_typed_error(vmvx_build, variant, error):
    """A workgroup function given bindings shorter than it reads stops
    with a typed error before touching memory past them."""
    lib = vmvx.load_executable(_executable_bytes(vmvx_build("elementwise", variant)))
    (export_,) = [e for e in lib.exports if "int_ops" in e.name]
    run = lib.prepare(export_.ordinal, (1, 1, 1), [], export_.binding_count)
    full = [VmBuffer(bytearray(128)) for _ in range(export_.binding_count)]
    full[1] = VmBuffer(bytearray(b"\x01" * 128))
    run.run_buffers(full)                       # the right sizes run
    short = list(full)
    short[0] = VmBuffer(bytearray(100))
    with pytest.raises(error) as exc:
        run.run_buffers(short)
    assert isinstance(exc.value, HalCpuError)
    assert exc.value.code == 11                 # OUT_OF_RANGE
    if variant == "ukernels":
        assert exc.value.field.startswith("vmvx.") and exc.value.value[1] > 100


def test_ops_check_every_span_first():
    add = vmvx.OPS["add.2d.f32"][1]
    a = VmBuffer(bytearray(np.arange(16, dtype=np.float32).tobytes()))
    out = VmBuffer(bytearray(64))
    add(a, 0, 4, 1, a, 0, 4, 1, out, 0, 4, 1, 4, 4)
    np.testing.assert_array_equal(np.frombuffer(out.data, np.float32),
                                  2 * np.arange(16, dtype=np.float32))
    before = bytes(out.data)
    for args, field in (
            ((a, 1, 4, 1, a, 0, 4, 1, out, 0, 4, 1, 4, 4), "vmvx.add.2d.f32 lhs"),
            ((a, 0, 5, 1, a, 0, 4, 1, out, 0, 4, 1, 4, 4), "vmvx.add.2d.f32 lhs"),
            ((a, 0, 4, 1, a, 0, 4, 1, out, 0, 4, 1, 4, 5), "vmvx.add.2d.f32 lhs"),
            ((a, 0, 4, 1, a, 0, 4, 1, out, 0, 4, 2, 4, 4), "vmvx.add.2d.f32 out")):
        with pytest.raises(vmvx.VmvxAccessError) as exc:
            add(*args)
        assert exc.value.field == field and exc.value.code == 11
    with pytest.raises(vmvx.VmvxError) as exc:   # negative stride: overflow
        add(a, 0, -4, 1, a, 0, 4, 1, out, 0, 4, 1, 4, 4)
    assert exc.value.code == 3 and exc.value.value == -4
    ro = VmBuffer(bytes(64), readonly=True)
    with pytest.raises(vmvx.VmvxAccessError) as exc:
        add(a, 0, 4, 1, a, 0, 4, 1, ro, 0, 4, 1, 4, 4)
    assert exc.value.code == 7
    with pytest.raises(vmvx.VmvxError):          # integer division by zero
        vmvx.OPS["divs.2d.i32"][1](a, 0, 4, 1, VmBuffer(bytearray(64)), 0, 4, 1,
                                   out, 0, 4, 1, 4, 4)
    with pytest.raises(vmvx.VmvxError) as exc:   # an unknown mmt4d type
        vmvx.OPS["mmt4d"][1](a, 0, 4, a, 0, 4, out, 0, 4, 1, 1, 1, 1, 1, 1, 0x33)
    assert exc.value.field == "vmvx.mmt4d flags"
    assert bytes(out.data) == before


def test_copy_pack_unpack_match_numpy():
    rng = np.random.default_rng(7)
    src = rng.integers(0, 2**32, (6, 10), dtype=np.uint32)
    sbuf = VmBuffer(bytearray(src.tobytes()))
    dst = VmBuffer(bytearray(src.nbytes))
    # a transposing copy of the top-left 5x6 block
    vmvx.OPS["copy.2d.x32"][1](sbuf, 0, 10, 1, dst, 0, 1, 5, 5, 6)
    got = np.frombuffer(dst.data, np.uint32)[:30].reshape(6, 5)
    np.testing.assert_array_equal(got, src[:5, :6].T)
    for flags in (0x1, 0x101, 0x201, 0x301):
        tiles = VmBuffer(bytearray(2 * 3 * 4 * 4 * 4))
        o0, o1 = (3, 2) if flags & 0x200 else (2, 3)
        vmvx.OPS["pack"][1](sbuf, 0, 10, 1, tiles, 0, o1 * 16, 16, 6, 10,
                            o0, o1, 4, 4, 0xAB, flags)
        t = np.frombuffer(tiles.data, np.uint32).reshape(o0, o1, 4, 4)
        padded = np.full((8, 12), 0xAB, np.uint32)
        padded[:6, :10] = src
        want = padded.reshape(2, 4, 3, 4).transpose(0, 2, 1, 3)
        if flags & 0x100:
            want = want.transpose(0, 1, 3, 2)
        if flags & 0x200:
            want = want.transpose(1, 0, 2, 3)
        np.testing.assert_array_equal(t, want)
        back = VmBuffer(bytearray(src.nbytes))
        vmvx.OPS["unpack"][1](tiles, 0, o1 * 16, 16, back, 0, 10, 1, o0, o1, 4,
                              4, 6, 10, flags)
        np.testing.assert_array_equal(np.frombuffer(back.data, np.uint32).reshape(6, 10),
                                      src)


def test_bad_executables_are_typed_errors(vmvx_build):
    data = _executable_bytes(vmvx_build("elementwise", "ukernels"))
    with pytest.raises(ModuleFormatError) as fmt:
        vmvx.load_executable(data[:200], label="cut.fb")
    assert fmt.value.name == "cut.fb"
    with pytest.raises(vmvx.VmvxError):     # as hal.executable.create sees it
        vmvx.load_executable(data[:200])
    with pytest.raises(vmvx.VmvxError):
        vmvx.load_executable(data, constants=b"\0\0\0\0")
    # an import the vmvx module does not have
    bad = data.replace(b"add.2d.i32", b"add.2d.q32")
    with pytest.raises(vmvx.VmvxError) as exc:
        vmvx.load_executable(bad)
    assert exc.value.code == 5 and exc.value.value == "vmvx.add.2d.q32"


def test_hal_module_creates_vmvx_executables(vmvx_build):
    from hal_cpu.programs.vm.hal_module import Executable
    with HalModule(arch=HOST) as hal:
        dev = hal.devices_get(0)
        fmt = VmBuffer(vmvx.VMVX_FORMAT.encode(), readonly=True)
        assert hal.device_query_i64(dev, VmBuffer(b"hal.executable.format"), fmt) == (1, 1)
        data = VmBuffer(_executable_bytes(vmvx_build("matmul", "tiled")), readonly=True)
        exe = hal.executable_create(dev, -1, fmt, data, None)
        assert type(exe) is Executable and exe.format == vmvx.VMVX_FORMAT
        name = next(e.name for e in exe.library.exports if "matmul_odd" in e.name)
        assert hal.executable_lookup_function(exe, VmBuffer(name.encode())) >= 0
        with pytest.raises(vmvx.VmvxError) as exc:
            hal.executable_create(dev, -1, fmt, VmBuffer(b"PK\x03\x04junk"), None)
        assert exc.value.code == 3 and exc.value.field.startswith("vmvx executable")


def test_run_module_names_the_file_and_the_bad_import(vmvx_build, tmp_path, capsys):
    """A .vmfb whose vmvx executable imports an op the vmvx module lacks
    (the name patched in place) fails as one line naming the file, the
    import and the source line; nothing runs."""
    data = vmvx_build("elementwise", "ukernels").read_bytes()
    assert b"vmvx.add.2d.f32" in data
    bad = tmp_path / "bad.vmfb"
    bad.write_bytes(data.replace(b"vmvx.add.2d.f32", b"vmvx.add.2d.q32"))
    rc = main(["run-module", str(bad), "--function=float_ops",
               "--input=4x8xf32=1", "--input=4x8xf32=2"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and len(err.splitlines()) == 1
    assert str(bad) in err and "@vmvx.add.2d.q32" in err
    assert "elementwise.mlir:" in err
