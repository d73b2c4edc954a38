"""``hal-cpu demo``: run the bundled sample executables on every
architecture and check them against numpy, then call an import resolved by
the bundled sample plugin on every architecture.

The samples in ``hal_cpu/samples`` were compiled by ``iree-compile`` from our
own MLIR (:mod:`hal_cpu.buildtools.samples`); ``manifest.json`` gives each kernel's
export, bindings and per-architecture workgroup count. ``standalone.sos``
there is the sample plugin bundle (a copy of
``sample_plugins/prebuilt/standalone.sos``, built from
``sample_plugins/standalone_plugin.c`` for six architectures).
"""

from __future__ import annotations

import json
import time

import numpy as np

import elfloader
from fatelf.cstruct import CStruct

from ..library import Executable
from ..samples import HERE as SAMPLES
from ..samples import REFERENCES

TOLERANCE = 1e-3


#: The sample plugin bundle and the import the demo resolves through it.
PLUGIN_BUNDLE = SAMPLES / "standalone.sos"
PLUGIN_IMPORT = "simple_mul_workgroup"
#: Elements each call of the import processes (sample_common.h, TILE_SIZE).
PLUGIN_TILE = 64
#: The import's params struct (sample_common.h, mul_params_t), laid out per
#: pointer width; binding2 = binding0 * binding1 over one tile.
MUL_PARAMS = CStruct("mul_params_t", [
    ("binding0", "ptr"), ("binding0_offset", "size"),
    ("binding1", "ptr"), ("binding1_offset", "size"),
    ("binding2", "ptr"), ("binding2_offset", "size"),
    ("dim", "size"), ("tid", "size"),
    ("processor_id", "u32"), ("processor_data", "ptr")])


def load_manifest() -> dict:
    return json.loads((SAMPLES / "manifest.json").read_text())


def run_sample(kernel: dict, arch: str, backend: str, seed: int = 0):
    """Run one sample; returns (max abs error, seconds per dispatch)."""
    rng = np.random.default_rng(seed)
    inputs, outputs = [], []
    arrays = []
    for b in kernel["bindings"]:
        if b["role"] == "input":
            arr = rng.standard_normal(b["shape"]).astype(b["dtype"])
            inputs.append(arr)
        else:
            arr = np.zeros(b["shape"], b["dtype"])
            outputs.append(arr)
        arrays.append(arr)
    entry = kernel["per_arch"][arch]
    with Executable(SAMPLES / entry["file"], arch=arch, backend=backend) as exe:
        start = time.perf_counter()
        exe.dispatch(kernel["export"], entry["workgroup_count"], arrays,
                     entry["constants"])
        seconds = time.perf_counter() - start
        engine = getattr(exe.backend, "engine", "-")
    expected = REFERENCES[kernel["reference"]](*inputs)
    error = float(np.max(np.abs(outputs[0] - expected)))
    return error, seconds, engine


def run_plugin_sample(arch: str, backend: str = "auto", n: int = 3 * 64 + 5,
                      seed: int = 0):
    """Load the sample plugin bundle for ``arch``, resolve
    :data:`PLUGIN_IMPORT` through a :class:`~hal_cpu.plugins.PluginManager`
    and call it once per 64-element tile of ``n`` float32 products.

    Returns:
        (name of the plugin that resolved the import, max abs error against
        numpy, seconds for all calls, backend kind that ran them, emulation
        engine or ``"-"``).

    Raises:
        hal_cpu.UnresolvedImportError: the bundle does not provide it.
        hal_cpu.DispatchError: a call returned non-zero.
        elfloader.ElfError: the bundle has no ``arch`` record or cannot load.
    """
    from elfloader import as_int32

    from ..errors import DispatchError
    from ..plugins import PluginManager
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    with PluginManager(arch, backend) as manager:
        be = manager.backend
        plugin = manager.register_spec(str(PLUGIN_BUNDLE))
        (fn,), (context,) = manager.resolve([PLUGIN_IMPORT])
        layout = MUL_PARAMS.layout(*be.arch.c_abi)
        allocs = [be.alloc(max(x.nbytes, 1), 64) for x in (a, b, a)]
        pa, pb, pc = allocs
        be.write(pa, a.tobytes())
        be.write(pb, b.tobytes())
        params = be.alloc(layout.size, 64)
        allocs.append(params)
        try:
            start = time.perf_counter()
            for tid in range(-(-n // PLUGIN_TILE)):
                be.write(params, layout.pack(binding0=pa, binding1=pb,
                                             binding2=pc, dim=n, tid=tid))
                status = as_int32(be.call(fn, params, context, 0))
                if status:
                    raise DispatchError(f"{PLUGIN_IMPORT} returned {status} "
                                        f"for tile {tid}", name=str(PLUGIN_BUNDLE),
                                        field=PLUGIN_IMPORT, value=status)
            seconds = time.perf_counter() - start
            out = np.frombuffer(be.read(pc, a.nbytes), np.float32)
        finally:
            for address in allocs:
                be.release(address)
        return (plugin.name, float(np.max(np.abs(out - a * b))), seconds,
                be.kind, getattr(be, "engine", "-"))


def _engine_line() -> str:
    """Which engine runs the emulated rows, and what qemu-user adds."""
    from elfloader.backend.emulated import qemu_program
    if all(qemu_program(a) for a in ("x86_64", "aarch64", "riscv64")):
        return ("emulation engine: qemu-user (vector ISAs: AVX2/FMA, SVE, RVV; "
                "hal-cpu profiles lists the CPU models)")
    return ("emulation engine: unicorn (no AVX2/FMA, SVE or RVV: install "
            "qemu-user, e.g. apt-get install qemu-user, to run vector code)")


def run_demo(arches=None) -> int:
    """Print the demo table; returns 0 when every output matches numpy."""
    manifest = load_manifest()
    host = elfloader.arch.host()
    rows = []
    for arch in arches or manifest["arches"]:
        backends = ["emulated"]
        if host is not None and arch == host.name:
            backends = ["native", "emulated"]
        for backend in backends:
            for name, kernel in manifest["kernels"].items():
                error, seconds, engine = run_sample(kernel, arch, backend)
                rows.append((arch, backend, engine, name, error, seconds))
    header = ("architecture", "backend", "engine", "kernel", "max abs error",
              "time")
    lines = [f"{header[0]:<13} {header[1]:<9} {header[2]:<8} {header[3]:<9} "
             f"{header[4]:>13} {header[5]:>10}"]
    failed = 0
    for arch, backend, engine, name, error, seconds in rows:
        ok = error <= TOLERANCE
        failed += not ok
        lines.append(f"{arch:<13} {backend:<9} {engine:<8} {name:<9} "
                     f"{error:>13.2e} {seconds * 1e3:>8.2f}ms"
                     f"{'' if ok else '  MISMATCH'}")
    print(_engine_line())
    print("\n".join(lines))
    print(f"{len(rows) - failed} of {len(rows)} sample dispatches match numpy "
          f"(tolerance {TOLERANCE:g})")
    print()
    print(f"import {PLUGIN_IMPORT} resolved by the sample plugin "
          f"({PLUGIN_BUNDLE.name}), a * b in {PLUGIN_TILE}-element tiles:")
    print(f"{header[0]:<13} {header[1]:<9} {header[2]:<8} {'plugin':<17} "
          f"{header[4]:>13} {header[5]:>10}")
    plugin_failed = 0
    chosen = arches or manifest["arches"]
    for arch in chosen:
        name, error, seconds, kind, engine = run_plugin_sample(arch)
        ok = error <= TOLERANCE
        plugin_failed += not ok
        print(f"{arch:<13} {kind:<9} {engine:<8} {name:<17} {error:>13.2e} "
              f"{seconds * 1e3:>8.2f}ms{'' if ok else '  MISMATCH'}")
    print(f"{len(chosen) - plugin_failed} of {len(chosen)} plugin imports "
          f"match numpy (tolerance {TOLERANCE:g})")
    return 1 if failed or plugin_failed else 0
