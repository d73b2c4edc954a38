#!/usr/bin/env python3
"""Build the sample executable plugins into sample_plugins/prebuilt/.

    python sample_plugins/build.py [--out-dir DIR] [--no-system] [--no-fat]

Outputs (DIR defaults to sample_plugins/prebuilt):

  standalone_<arch>.so       standalone_plugin.c, one per architecture
  standalone_alt_<arch>.so   the same source with -DPLUGIN_VARIANT=2
  standalone.sos             FatELF bundle of the six standalone_<arch>.so
  standalone_alt.sos         FatELF bundle of the six standalone_alt_<arch>.so
  system_plugin_<host>.so    system_plugin.c as an ordinary host library

Standalone plugins are compiled with zig's clang (PyPI package `ziglang`,
run as `python -m ziglang`) for freestanding targets and linked with its
ld.lld into self-contained ET_DYN objects: no libc, no DT_NEEDED, no
undefined symbols, only RELATIVE relocations.  The build is reproducible:
the same ziglang version produces the same bytes on every run and in any
output directory (sources are compiled from this directory by relative
name, without debug info or build ids).

The FatELF bundles are written with this project's `fatelf.join()`.
The system plugin is built with `cc` when available, otherwise with
`python -m ziglang cc -target <host>-linux-gnu`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
DEFAULT_OUT_DIR = HERE / "prebuilt"

# The ziglang release the committed prebuilt files were produced with.
ZIG_VERSION = "0.17.0"


@dataclass(frozen=True)
class Arch:
    name: str  # our architecture name, used in file names
    cflags: tuple[str, ...]  # target selection for zig cc
    e_machine: str  # pyelftools name of the expected ELF machine
    elfclass: int  # 32 or 64


# Build order (fatelf.join sorts the bundle's records by target itself).
ARCHES: tuple[Arch, ...] = (
    Arch("x86_64", ("-target", "x86_64-freestanding-none"), "EM_X86_64", 64),
    Arch("aarch64", ("-target", "aarch64-freestanding-none"), "EM_AARCH64", 64),
    Arch(
        "riscv64",
        ("-target", "riscv64-freestanding-none", "-mcpu=generic_rv64+m+a+f+d+c"),
        "EM_RISCV",
        64,
    ),
    Arch("x86_32", ("-target", "x86-freestanding-none"), "EM_386", 32),
    Arch(
        "arm32",
        ("-target", "arm-freestanding-eabihf", "-mcpu=cortex_a15"),
        "EM_ARM",
        32,
    ),
    Arch(
        "riscv32",
        ("-target", "riscv32-freestanding-none", "-mcpu=generic_rv32+m+f"),
        "EM_RISCV",
        32,
    ),
)
ARCH_BY_NAME = {a.name: a for a in ARCHES}

# name prefix -> extra compiler defines
VARIANTS: dict[str, tuple[str, ...]] = {
    "standalone": (),
    "standalone_alt": ("-DPLUGIN_VARIANT=2",),
}

STANDALONE_SOURCE = "standalone_plugin.c"
SYSTEM_SOURCE = "system_plugin.c"

COMMON_CFLAGS = (
    "-std=c17",
    "-fPIC",
    "-ffreestanding",
    "-fvisibility=hidden",
    "-fdata-sections",
    "-ffunction-sections",
    # No .eh_frame / .ARM.exidx personality references (those would leave
    # __aeabi_unwind_cpp_pr* undefined on arm).
    "-fno-unwind-tables",
    "-fno-asynchronous-unwind-tables",
    "-fno-stack-protector",
    "-g0",
    "-O2",
    "-Wall",
    "-Werror",
)

LINK_FLAGS = (
    "--build-id=none",
    "-nostdlib",
    "-static",
    "-shared",
    "--no-undefined",
    "--gc-sections",
    "-z",
    "now",
    "-z",
    "relro",
    "--discard-all",
    "--strip-debug",
    "--hash-style=sysv",
)

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


class BuildError(RuntimeError):
    pass


def _run(cmd: list[str], cwd: Path) -> None:
    env = dict(os.environ)
    # Keep zig's cache out of the way of concurrent builds of other projects
    # but shared between our own invocations.
    env.setdefault("ZIG_GLOBAL_CACHE_DIR", str(Path(tempfile.gettempdir()) / "sample_plugins_zig_cache"))
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        )


def zig_command() -> list[str]:
    return [sys.executable, "-m", "ziglang"]


def zig_available() -> bool:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return False
    return True


def zig_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("ziglang")
    except Exception:
        return None


# --------------------------------------------------------------------------
# Checking outputs
# --------------------------------------------------------------------------

def check_standalone_elf(data: bytes, arch: Arch) -> None:
    """Raise BuildError unless `data` is a self-contained plugin for `arch`."""
    import io

    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection

    elf = ELFFile(io.BytesIO(data))
    problems = []
    if elf.header["e_type"] != "ET_DYN":
        problems.append(f"e_type {elf.header['e_type']}")
    if elf.header["e_machine"] != arch.e_machine:
        problems.append(f"e_machine {elf.header['e_machine']}")
    if elf.elfclass != arch.elfclass:
        problems.append(f"ELF class {elf.elfclass}")
    exported = set()
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    problems.append(f"DT_NEEDED {tag.needed}")
        if section.name == ".dynsym":
            for sym in section.iter_symbols():
                if not sym.name:
                    continue
                if sym["st_shndx"] == "SHN_UNDEF":
                    problems.append(f"undefined symbol {sym.name}")
                else:
                    exported.add(sym.name)
        if isinstance(section, RelocationSection) and section["sh_flags"] & 0x2:
            for reloc in section.iter_relocations():
                rtype = reloc["r_info_type"]
                if rtype not in _relative_types(elf.header["e_machine"]):
                    problems.append(f"relocation type {rtype} in {section.name}")
    if "iree_hal_executable_plugin_query" not in exported:
        problems.append("iree_hal_executable_plugin_query not exported")
    if problems:
        raise BuildError(f"{arch.name}: " + "; ".join(problems))


def _relative_types(machine: str) -> set[int]:
    return {
        "EM_X86_64": {8},  # R_X86_64_RELATIVE
        "EM_AARCH64": {1027},  # R_AARCH64_RELATIVE
        "EM_RISCV": {3},  # R_RISCV_RELATIVE
        "EM_386": {8},  # R_386_RELATIVE
        "EM_ARM": {23},  # R_ARM_RELATIVE
    }[machine]


# --------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------

def build_standalone_one(variant: str, arch: Arch, work_dir: Path) -> bytes:
    """Compile and link one standalone plugin; returns the ELF bytes."""
    obj = work_dir / f"{variant}_{arch.name}.o"
    out = work_dir / f"{variant}_{arch.name}.so"
    zig = zig_command()
    _run(
        zig
        + ["cc", *arch.cflags, *COMMON_CFLAGS, *VARIANTS[variant], "-c", STANDALONE_SOURCE, "-o", str(obj)],
        cwd=HERE,
    )
    _run(zig + ["ld.lld", *LINK_FLAGS, str(obj), "-o", str(out)], cwd=HERE)
    data = out.read_bytes()
    check_standalone_elf(data, arch)
    return data


def build_standalone(out_dir: Path, jobs: int | None = None) -> dict[str, bytes]:
    """Build every variant for every arch; returns {file name: bytes}."""
    if not zig_available():
        raise BuildError("the `ziglang` package is required: pip install ziglang==" + ZIG_VERSION)
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
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        import fatelf
        join = fatelf.join
    except (ImportError, AttributeError) as e:
        raise BuildError(f"fatelf.join is not available: {e}") from e
    written = {}
    for variant in VARIANTS:
        names = [f"{variant}_{arch.name}.so" for arch in ARCHES]
        data = join([singles[n] for n in names], names=names)
        name = f"{variant}.sos"
        (out_dir / name).write_bytes(data)
        written[name] = data
    return written


def host_arch() -> str:
    machine = platform.machine().lower()
    return {
        "amd64": "x86_64",
        "x86_64": "x86_64",
        "arm64": "aarch64",
        "aarch64": "aarch64",
        "riscv64": "riscv64",
    }.get(machine, machine)


def system_plugin_name(arch: str | None = None) -> str:
    return f"system_plugin_{arch or host_arch()}.so"


def build_system(out_dir: Path, compiler: str | None = None) -> Path:
    """Build system_plugin.c as a host shared library.

    `compiler` is "cc", "zig" or None (cc if found on PATH, else zig).
    """
    arch = host_arch()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / system_plugin_name(arch)
    if compiler is None:
        compiler = "cc" if shutil.which("cc") else "zig"
    if compiler == "cc":
        cmd = ["cc", *SYSTEM_CFLAGS, "-I.", SYSTEM_SOURCE, "-o", str(out)]
    elif compiler == "zig":
        if not zig_available():
            raise BuildError("neither `cc` nor the `ziglang` package is available")
        cmd = zig_command() + ["cc", "-target", f"{arch}-linux-gnu", *SYSTEM_CFLAGS, "-I.", SYSTEM_SOURCE, "-o", str(out)]
    else:
        raise ValueError(compiler)
    _run(cmd, cwd=HERE)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--no-system", action="store_true", help="skip the host system plugin")
    parser.add_argument("--no-fat", action="store_true", help="skip the .sos FatELF bundles")
    parser.add_argument("--system-compiler", choices=("cc", "zig"), default=None)
    parser.add_argument("-j", "--jobs", type=int, default=None)
    args = parser.parse_args(argv)

    version = zig_version()
    if version and version != ZIG_VERSION:
        print(
            f"warning: ziglang {version} differs from {ZIG_VERSION}; "
            "outputs will not match the committed prebuilt files",
            file=sys.stderr,
        )
    try:
        singles = build_standalone(args.out_dir, args.jobs)
        for name in sorted(singles):
            print(f"{args.out_dir / name}: {len(singles[name])} bytes")
        if not args.no_fat:
            for name, data in build_fat(args.out_dir, singles).items():
                print(f"{args.out_dir / name}: {len(data)} bytes")
        if not args.no_system:
            path = build_system(args.out_dir, args.system_compiler)
            print(f"{path}: {path.stat().st_size} bytes")
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
