#!/usr/bin/env python3
"""Build the sample executable plugins into sample_plugins/prebuilt/.

    python sample_plugins/build.py [--out-dir DIR] [--no-system] [--no-fat]

Outputs (DIR defaults to sample_plugins/prebuilt):

  standalone_<arch>.so       standalone_plugin.c, one per architecture
  standalone_alt_<arch>.so   the same source with -DPLUGIN_VARIANT=2
  standalone.sos             FatELF bundle of the six standalone_<arch>.so
  standalone_alt.sos         FatELF bundle of the six standalone_alt_<arch>.so
  system_plugin_<host>.so    system_plugin.c as an ordinary host library
  vector.sos                 vector_plugin.c built for the vector CPU profiles
                             (VECTOR_PROFILES: AVX2+FMA, SVE, RVV, NEON, Zve32f)

With the default DIR, standalone.sos is also copied to
hal_cpu/samples/standalone.sos, the copy the package ships for
`hal-cpu demo`.

Standalone plugins are built by `hal_cpu.buildtools.zig`: zig's clang (PyPI
package `ziglang`, run as `python -m ziglang`) compiles them for the
freestanding targets of the architecture table (`fatelf.arches`) and its
ld.lld links self-contained ET_DYN objects: no libc, no DT_NEEDED, no
undefined symbols, only RELATIVE relocations.  The build is reproducible:
the same ziglang version produces the same bytes on every run and in any
output directory (sources are compiled from this directory by relative
name, without debug info or build ids).

The FatELF bundles are written with this project's `fatelf.join()`.
The system plugin is built with `cc` when available, otherwise with
`python -m ziglang cc -target <cpu>-linux-gnu` for the host architecture
(`fatelf.arches.host_arch()`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
DEFAULT_OUT_DIR = HERE / "prebuilt"
#: The package's copy of standalone.sos (package data, used by the demo).
PACKAGE_COPY = REPO_ROOT / "hal_cpu" / "samples" / "standalone.sos"

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import fatelf  # noqa: E402
from elfloader.arch import by_name  # noqa: E402
from fatelf import arches  # noqa: E402
from hal_cpu.buildtools import zig as zigbuild  # noqa: E402
from hal_cpu.buildtools.zig import ZIG_VERSION, ZigBuildError, zig_available, zig_version  # noqa: E402,F401

#: Architectures of the standalone plugins, in the table's order
#: (fatelf.join sorts the bundle's records by target itself).
ARCHES = tuple(arches.lookup(name) for name in arches.RUNTIME_ARCHES)

# name prefix -> extra compiler defines
VARIANTS: dict[str, tuple[str, ...]] = {
    "standalone": (),
    "standalone_alt": ("-DPLUGIN_VARIANT=2",),
}

STANDALONE_SOURCE = "standalone_plugin.c"
SYSTEM_SOURCE = "system_plugin.c"
PLUGIN_QUERY = "iree_hal_executable_plugin_query"

SYSTEM_CFLAGS = (
    "-std=c11",
    "-shared",
    "-fPIC",
    "-O2",
    "-g0",
    "-Wall",
    "-Werror",
    "-Wl,--build-id=none",
    "-Wl,--hash-style=gnu",
)

#: plugin_abi.h, the package's copy (hal_cpu.get_include()), relative to
#: this directory so that the outputs do not depend on where the tree is.
INCLUDE = os.path.relpath(REPO_ROOT / "hal_cpu" / "include", HERE)


# --------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------

def build_standalone_one(variant: str, arch: arches.ArchInfo, work_dir: Path) -> bytes:
    """Compile and link one standalone plugin; returns the checked ELF bytes."""
    return zigbuild.build_freestanding(
        STANDALONE_SOURCE, arch, cwd=HERE, work_dir=work_dir,
        defines=VARIANTS[variant], stem=variant, exports=[PLUGIN_QUERY],
        include_dirs=[INCLUDE])


def build_standalone(out_dir: Path, jobs: int | None = None) -> dict[str, bytes]:
    """Build every variant for every arch; returns {file name: bytes}."""
    zigbuild.require_zig()
    results: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="sample_plugins_") as tmp:
        work = Path(tmp)
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
            futures = {
                pool.submit(build_standalone_one, variant, arch, work): f"{variant}_{arch.name}.so"
                for variant in VARIANTS
                for arch in ARCHES
            }
            for future, name in futures.items():
                results[name] = future.result()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(results):
        (out_dir / name).write_bytes(results[name])
    return results


def build_fat(out_dir: Path, singles: dict[str, bytes]) -> dict[str, bytes]:
    """Pack the per-arch standalone objects into one FatELF per variant."""
    written = {}
    for variant in VARIANTS:
        names = [f"{variant}_{arch.name}.so" for arch in ARCHES]
        data = fatelf.join([singles[n] for n in names], names=names)
        name = f"{variant}.sos"
        (out_dir / name).write_bytes(data)
        written[name] = data
    return written


def system_plugin_name(arch: str | None = None) -> str:
    return f"system_plugin_{arch or arches.host_arch()}.so"


def _host_zig_target(info: arches.ArchInfo) -> list[str]:
    """zig flags for a Linux/glibc host of ``info``: its freestanding target
    with the OS and ABI replaced, plus its CPU flags."""
    flags = list(info.zig_flags)
    i = flags.index("-target")
    cpu, _, rest = flags[i + 1].partition("-")
    flags[i + 1] = f"{cpu}-linux-{'gnueabihf' if rest.endswith('eabihf') else 'gnu'}"
    return flags


#: The CPU profile vector.sos is built for, per architecture: each
#: :attr:`elfloader.arch.Arch.builds`'s ``vector_profile``.
VECTOR_PROFILES = {name: by_name(name).builds.vector_profile
                   for name in arches.RUNTIME_ARCHES}


def build_vector(out_dir: Path, jobs: int | None = None) -> Path:
    """vector_plugin.c for every architecture, each for its vector profile
    (:data:`VECTOR_PROFILES`), packed as ``vector.sos``."""
    data = zigbuild.build_plugin([HERE / "vector_plugin.c"], "all",
                                 cpu=VECTOR_PROFILES, jobs=jobs)
    path = out_dir / "vector.sos"
    path.write_bytes(data)
    return path


def build_system(out_dir: Path, compiler: str | None = None) -> Path:
    """Build system_plugin.c as a host shared library.

    `compiler` is "cc", "zig" or None (cc if found on PATH, else zig).
    """
    host = arches.lookup(arches.host_arch())
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / system_plugin_name(host.name)
    if compiler is None:
        compiler = "cc" if shutil.which("cc") else "zig"
    if compiler == "cc":
        cmd = ["cc", *SYSTEM_CFLAGS, "-I.", f"-I{INCLUDE}", SYSTEM_SOURCE, "-o", str(out)]
    elif compiler == "zig":
        if not zig_available():
            raise ZigBuildError("neither `cc` nor the `ziglang` package is available",
                                field="compiler")
        cmd = zigbuild.zig_command() + ["cc", *_host_zig_target(host), *SYSTEM_CFLAGS,
                                        "-I.", f"-I{INCLUDE}", SYSTEM_SOURCE, "-o", str(out)]
    else:
        raise ValueError(compiler)
    zigbuild.run(cmd, cwd=HERE)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--no-system", action="store_true", help="skip the host system plugin")
    parser.add_argument("--no-fat", action="store_true", help="skip the .sos FatELF bundles")
    parser.add_argument("--system-compiler", choices=("cc", "zig"), default=None)
    parser.add_argument("-j", "--jobs", type=int, default=None)
    args = parser.parse_args(argv)

    zigbuild.warn_if_other_version()
    try:
        singles = build_standalone(args.out_dir, args.jobs)
        for name in sorted(singles):
            print(f"{args.out_dir / name}: {len(singles[name])} bytes")
        if not args.no_fat:
            fat = build_fat(args.out_dir, singles)
            for name, data in fat.items():
                print(f"{args.out_dir / name}: {len(data)} bytes")
            if args.out_dir.resolve() == DEFAULT_OUT_DIR:
                PACKAGE_COPY.write_bytes(fat["standalone.sos"])
                print(f"{PACKAGE_COPY}: {len(fat['standalone.sos'])} bytes")
        path = build_vector(args.out_dir, args.jobs)
        print(f"{path}: {path.stat().st_size} bytes")
        if not args.no_system:
            path = build_system(args.out_dir, args.system_compiler)
            print(f"{path}: {path.stat().st_size} bytes")
    except ZigBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
