"""IREE's own aarch64 runtime under qemu-user against our emulated dispatch
(qemu engine) on the same IREE-compiled executables.

Usage: python bench/iree_under_qemu.py [--quick] [--rounds R]
           [--iterations K] [--kernel matmul|conv ...] [--build B ...]
           [--fill V ...] [--vlen BITS] [--sysroot DIR] [--cache DIR]

The programs are ``bench/programs/matmul256.mlir`` (256x256x256 f32 matmul)
and ``bench/programs/conv3x3.mlir`` (3x3 f32 convolution, NHWC 1x34x34x32
input, 32 output channels), each one dispatch, compiled with
``hal_cpu.programs.compile_program`` (cached by content hash) for aarch64:

* ``generic``: CPU profile ``armv8-a`` (NEON); run on qemu's ``cortex-a57``;
* ``sve``: CPU profile ``sve`` (vector-length agnostic SVE); run on qemu's
  ``max`` CPU with SVE at ``--vlen`` bits (default 256);
* ``neoverse-v1``: the ``sve`` profile's flags plus
  ``--iree-llvmcpu-target-cpu=neoverse-v1``; run like ``sve``.

``hal_cpu.programs.vm.plan_program`` (a record-only call on the VM) gives each
dispatch's export, workgroup count and
bindings. Both runners get the same ``.so``, export, workgroup count and
binding contents (inputs all V, output 0; ``--fill``):

* IREE: the aarch64 ``iree-benchmark-executable`` of the
  ``iree-base-runtime`` wheel of the installed version (manylinux_2_28
  aarch64; downloaded with ``pip download`` on first use into the cache
  directory, outside the repository) run as ``qemu-aarch64 -L SYSROOT
  -cpu MODEL iree-benchmark-executable --device=local-sync`` (one thread),
  ``--batch_size=1`` (one dispatch per submitted command buffer),
  ``--benchmark_min_warmup_time`` (one warm-up dispatch: qemu translates
  the code) and ``--benchmark_min_time=Kx`` (K timed dispatches). One
  process per round; its ``real_time`` and ``cpu_time`` (the qemu
  process's CPU time) per dispatch. SYSROOT holds the aarch64 glibc and
  libstdc++ (Debian: ``apt-get install libc6-arm64-cross
  libstdc++6-arm64-cross``).
* ours: ``hal_cpu.Executable(so, backend="emulated", engine="qemu",
  cpu=PROFILE, vlen=...)`` (one per case, so one agent process per case),
  ``dispatch(..., workers=1)``, one dispatch per round after a warm-up
  dispatch (which also checks the result against numpy); wall time, and
  CPU time of the agent process (``/proc/PID/task/*/schedstat``) plus the
  calling thread.

MODEL is read from our backend (``backend._engine.cpu_option``), so both
run the same qemu-user CPU model and vector length. Each round runs every
case once, in an order rotated by one per round (``bench/_timing.py``);
the table gives min and median per dispatch and ours / IREE, by wall time
and by CPU time (on a shared machine wall time also counts waiting for a
core).

The input value matters under qemu: qemu computes a float operation on
the host's FPU only once the guest's sticky inexact flag is set, and
with softfloat otherwise. IREE's runtime process has done inexact
arithmetic before it dispatches; inputs of 1 make every product and sum
of the kernel exact, so a process that has not stays on softfloat (our
agent, which has run nothing but the kernel, when every input is 1). The
default fills are 0.1 (inexact) and 1 (exact).
"""

from __future__ import annotations

import argparse
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import _timing as T
import numpy as np
from dispatch import aligned_array, benchmark_args, binding_spec, loadavg, run_benchmark, versions
from emulator_vs_qemu import engine_cpu, median

from hal_cpu import Executable
from hal_cpu import programs as iree
from hal_cpu.programs.vm import plan_program

HERE = Path(__file__).resolve().parent
TOOL = "iree-benchmark-executable"
WHEEL_PLATFORM = "manylinux_2_28_aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"

#: name -> (program, input shapes, output shape, expected output / fill**2)
KERNELS = {
    "matmul": (HERE / "programs" / "matmul256.mlir",
               [(256, 256), (256, 256)], (256, 256), 256),
    "conv": (HERE / "programs" / "conv3x3.mlir",
             [(1, 34, 34, 32), (3, 3, 32, 32)], (1, 32, 32, 32), 3 * 3 * 32),
}
#: build -> (CPU profile, extra iree-compile flags, scalable vectors)
BUILDS = {
    "generic": ("armv8-a", (), False),
    "sve": ("sve", (), True),
    "neoverse-v1": ("sve", ("--iree-llvmcpu-target-cpu=neoverse-v1",), True),
}


# --- IREE's aarch64 runtime ---------------------------------------------------
def runtime_version() -> str:
    import importlib.metadata as md
    try:
        return md.version("iree-base-runtime")
    except md.PackageNotFoundError:
        return "3.13.0"


def default_cache() -> Path:
    import platformdirs
    return (Path(platformdirs.user_cache_dir("portable-kernel-runtime"))
            / "bench" / f"iree-base-runtime-{runtime_version()}-aarch64")


def aarch64_tool(cache: Path) -> Path:
    """``iree-benchmark-executable`` of the aarch64 wheel, downloaded into
    ``cache`` on first use.

    Raises:
        RuntimeError: ``pip download`` failed or the wheel lacks the tool.
    """
    tool = cache / TOOL
    if tool.is_file():
        return tool
    version = runtime_version()
    print(f"first use: downloading iree-base-runtime=={version} for "
          f"{WHEEL_PLATFORM} into {cache} (pip download)", flush=True)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
               "--only-binary=:all:", "--platform", WHEEL_PLATFORM,
               "--python-version", "3.11", f"iree-base-runtime=={version}",
               "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode or not wheels:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}"
                               f"{proc.stderr}")
        member = f"iree/_runtime_libs/{TOOL}"
        with zipfile.ZipFile(wheels[0]) as wheel:
            if member not in wheel.namelist():
                raise RuntimeError(f"{wheels[0].name} has no {member}")
            part = Path(tmp) / TOOL
            part.write_bytes(wheel.read(member))
        part.chmod(part.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        part.replace(tool)
    return tool


class IreeUnderQemu:
    """One ``qemu-aarch64 ... iree-benchmark-executable`` process per call:
    wall seconds per dispatch; CPU seconds per dispatch go to :attr:`cpu`."""

    def __init__(self, qemu: str, sysroot: str, cpu_option: str, tool: Path,
                 so: Path, entry_point: int, workgroup_count, bindings,
                 constants, iterations: int):
        self.argv = [qemu, "-L", sysroot, "-cpu", cpu_option, str(tool),
                     "--device=local-sync",
                     *benchmark_args("embedded-elf-arm_64", so, entry_point,
                                     workgroup_count, bindings, constants),
                     "--batch_size=1", "--benchmark_min_warmup_time=0.001",
                     f"--benchmark_min_time={iterations}x"]
        self.cpu: list[float] = []

    def __call__(self) -> float:
        real, cpu = run_benchmark(self.argv)
        self.cpu.append(cpu)
        return real


class Ours:
    """One dispatch of ``exe`` per call (``workers=1``): wall seconds; CPU
    seconds (agent process and calling thread) go to :attr:`cpu`."""

    def __init__(self, exe: Executable, export: str, workgroup_count, arrays,
                 constants):
        self.exe, self.export = exe, export
        self.count, self.arrays, self.constants = tuple(workgroup_count), arrays, constants
        self.cpu: list[float] = []

    def dispatch(self) -> None:
        self.exe.dispatch(self.export, self.count, self.arrays, self.constants,
                          workers=1)

    def __call__(self) -> float:
        backend = self.exe.backend
        cpu0, thread0 = engine_cpu(backend), time.thread_time()
        start = time.perf_counter()
        self.dispatch()
        wall = time.perf_counter() - start
        self.cpu.append(engine_cpu(backend) - cpu0 + time.thread_time() - thread0)
        return wall


def fill_list(text: str) -> list[float]:
    """``0.1,1`` -> ``[0.1, 1.0]`` (argparse type)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError("fills are comma-separated numbers")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    T.add_common_args(parser, rounds=5, quick_rounds=2)
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed dispatches per IREE process (default 3, "
                             "--quick: 2)")
    parser.add_argument("--kernel", action="append", choices=list(KERNELS))
    parser.add_argument("--build", action="append", choices=list(BUILDS))
    parser.add_argument("--fill", type=fill_list, default=[0.1, 1.0],
                        help="input values, comma-separated: one case per value "
                             "(default 0.1,1)")
    parser.add_argument("--vlen", type=int, default=256,
                        help="SVE vector length in bits of the sve builds "
                             "(default 256)")
    parser.add_argument("--sysroot", default=SYSROOT,
                        help=f"aarch64 glibc and libstdc++ for qemu -L "
                             f"(default {SYSROOT})")
    parser.add_argument("--cache", type=Path, default=None,
                        help="where the aarch64 IREE tool is kept (default: "
                             "<user cache dir>/portable-kernel-runtime/bench/...)")
    args = parser.parse_args()
    rounds = T.rounds_of(args)
    iterations = args.iterations or (2 if args.quick else 3)
    if iterations < 1:
        parser.error("--iterations must be at least 1")
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        print("qemu-aarch64 not found (apt-get install qemu-user)")
        return 1
    if not (Path(args.sysroot) / "lib" / "ld-linux-aarch64.so.1").exists():
        print(f"no aarch64 glibc under {args.sysroot} (Debian/Ubuntu: apt-get "
              f"install libc6-arm64-cross libstdc++6-arm64-cross)")
        return 1
    tool = aarch64_tool(args.cache or default_cache())
    load_before = loadavg()
    kernels = args.kernel or list(KERNELS)
    builds = args.build or list(BUILDS)

    cases: dict[str, T.Measure] = {}
    cpu_of: dict[str, list[float]] = {}
    info: dict[tuple[str, str], tuple] = {}
    opened: list[Executable] = []
    try:
        for name in kernels:
            program, in_shapes, out_shape, per_fill = KERNELS[name]
            for build in builds:
                profile, flags, scalable = BUILDS[build]
                vlen = args.vlen if scalable else None
                compiled = iree.compile_program(program, "aarch64", cpu=profile,
                                                extra_flags=flags)
                plan = plan_program(
                    compiled, [np.empty(s, np.float32) for s in in_shapes])
                (d,) = plan.dispatches
                for fill in args.fill:
                    # One executable (one agent process) per case: the
                    # agent's floating-point flags outlive a dispatch.
                    exe = Executable(d.so_path, backend="emulated", engine="qemu",
                                     cpu=profile, vlen=vlen)
                    opened.append(exe)
                    option = exe.backend._engine.cpu_option
                    ordinal = exe.export(d.export_name).ordinal
                    info[name, build] = (d, option, exe.backend.describe())
                    key = f"{name} {build} {fill:g}"
                    arrays = [aligned_array(s, np.float32, fill) for s in in_shapes]
                    arrays.append(aligned_array(out_shape, np.float32, 0))
                    ours = Ours(exe, d.export_name, d.workgroup_count, arrays,
                                d.constants)
                    ours.dispatch()      # warm-up (translation) and check
                    expected = np.float32(fill) * np.float32(fill) * per_fill
                    if not np.allclose(arrays[-1], expected, rtol=1e-4):
                        raise RuntimeError(f"{key}: wrong result (expected "
                                           f"{expected}, got {arrays[-1].flat[0]})")
                    specs = [binding_spec(s, np.float32, f"{fill:g}") for s in in_shapes]
                    specs.append(binding_spec(out_shape, np.float32, 0))
                    peer = IreeUnderQemu(qemu, args.sysroot, option, tool, d.so_path,
                                         ordinal, d.workgroup_count, specs,
                                         d.constants, iterations)
                    cases[f"iree {key}"], cpu_of[f"iree {key}"] = peer, peer.cpu
                    cases[f"ours {key}"], cpu_of[f"ours {key}"] = ours, ours.cpu
        stats = T.interleave(cases, rounds, progress=True)
    finally:
        for exe in opened:
            exe.close()

    print(T.machine_line())
    qemu_version = subprocess.run([qemu, "--version"], capture_output=True,
                                  text=True).stdout.splitlines()[0]
    print(f"{versions()}; {qemu_version}")
    print(f"load average before {load_before}, after {loadavg()}")
    print(f"IREE: qemu-aarch64 -L {args.sysroot} {tool} --device=local-sync "
          f"--batch_size=1, 1 warm-up + {iterations} timed dispatches per "
          f"process; ours: Executable(..., backend='emulated', engine='qemu'), "
          f"workers=1, one dispatch per sample; {rounds} rounds")
    for name in kernels:
        for build in builds:
            d, option, described = info[name, build]
            print(f"  {name} {build}: {d.so_path.name}, export {d.export_name}, "
                  f"workgroups {d.workgroup_count}; -cpu {option}")
    rows = []
    worst_wall = worst_cpu = 0.0
    for name in kernels:
        for build in builds:
            for fill in args.fill:
                key = f"{name} {build} {fill:g}"
                s, q = stats[f"ours {key}"], stats[f"iree {key}"]
                oc, qc = median(cpu_of[f"ours {key}"]), median(cpu_of[f"iree {key}"])
                if s.ok and q.ok:
                    worst_wall = max(worst_wall, s.median / q.median)
                if oc and qc:
                    worst_cpu = max(worst_cpu, oc / qc)
                rows.append([name, build, f"{fill:g}", T.fmt_time(q.min),
                             T.fmt_time(q.median), T.fmt_time(s.min),
                             T.fmt_time(s.median),
                             T.ratio(s.median, q.median) + f" (min {T.ratio(s.min, q.min)})",
                             T.fmt_time(qc), T.fmt_time(oc), T.ratio(oc, qc)])
    print("\nper dispatch; ratio = ours / IREE (same .so, -cpu, workgroups, "
          "bindings); cpu: median CPU time")
    print(T.table(["kernel", "build", "inputs", "IREE min", "IREE median",
                   "ours min", "ours median", "ratio (median)", "IREE cpu",
                   "ours cpu", "cpu ratio"], rows))
    print(f"largest ratio (median): {worst_wall:.2f}x wall, {worst_cpu:.2f}x cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
