"""Build the runtime support library bundle and the libm objects.

    python -m hal_cpu.buildtools.runtime [--out-dir DIR] [--keep-singles] [-j N]
                                    [--only runtime|libm]

Compiles ``workgroup_loop.c`` for every architecture the runtime runs
(:data:`fatelf.arches.RUNTIME_ARCHES`) with :mod:`hal_cpu.buildtools.zig` and
packs the six self-contained ET_DYN objects into ``DIR/runtime.sos``
(default: this package's directory, where the committed bundle lives) with
:func:`fatelf.join`; compiles ``libm.c`` into one relocatable object per
architecture of :data:`hal_cpu.runtime.LIBM_ARCHES`, each joined
(``ld.lld -r``) with compiler-rt's builtins as zig ships them
(``lib/compiler_rt.zig`` built with ``zig build-obj``: float conversions,
64-bit integer division and shifts, ``__aeabi_*`` helpers, every symbol
weak and hidden, one section per function), and packs them into
``DIR/libm.sos``. With the pinned ziglang release both bundles are
reproduced byte for byte.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
from pathlib import Path

import fatelf
from fatelf import arches

from ..runtime import BUNDLE, HERE, LIBM_ARCHES, LIBM_BUNDLE, LIBM_SOURCE, SOURCE, SYMBOLS
from . import zig as zigbuild

#: Compiler flags of the libm objects, after :data:`hal_cpu.buildtools.zig.CFLAGS`:
#: no contraction of ``a * b + c`` into a call to ``fmaf`` itself, no
#: compiler identification in a ``.comment`` section of every executable.
LIBM_CFLAGS: tuple[str, ...] = ("-ffp-contract=off", "-fno-ident")


#: ``zig build-obj`` flags of compiler-rt's builtins: small code,
#: position independent, one section per function (the executable's link
#: keeps only what it calls), no stack probes, no debug information.
COMPILER_RT_FLAGS: tuple[str, ...] = (
    "-OReleaseSmall", "-fPIC", "-ffunction-sections", "-fdata-sections",
    "-fno-stack-check", "-fstrip", "-fsingle-threaded", "-j1")


def compiler_rt_source() -> Path:
    """``lib/compiler_rt.zig`` of the installed ziglang package.

    Raises:
        hal_cpu.buildtools.zig.ZigBuildError: it is not there.
    """
    import ziglang  # the package's folder holds zig's lib/

    path = Path(ziglang.__file__).resolve().parent / "lib" / "compiler_rt.zig"
    if not path.is_file():
        raise zigbuild.ZigBuildError(f"{path}: compiler-rt's source is missing",
                                     name=str(path), field="compiler_rt", value=None)
    return path


def _target_flags(cc_flags: tuple[str, ...]) -> list[str]:
    """The ``-target``/``-mcpu`` flags of a ``zig cc`` command line, as
    ``zig build-obj`` takes them (it has no ``-mabi``: it derives the
    float ABI from the CPU's features, ilp32 for an rv32 without ``+f``)."""
    out: list[str] = []
    it = iter(cc_flags)
    for flag in it:
        if flag == "-target":
            out += [flag, next(it)]
        elif flag.startswith("-mcpu="):
            out.append(flag)
    return out


def build_singles(jobs: int | None = None) -> dict[str, bytes]:
    """Build the library for each runtime architecture.

    Returns:
        ``{"workgroup_loop_<arch>.so": ELF bytes}`` in table order.

    Raises:
        hal_cpu.buildtools.zig.ZigBuildError: ziglang missing or a build failed.
    """
    zigbuild.require_zig()
    with tempfile.TemporaryDirectory(prefix="hal_cpu_runtime_") as tmp:
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=jobs or os.cpu_count() or 2) as pool:
            futures = {
                f"{SOURCE.stem}_{name}.so": pool.submit(
                    zigbuild.build_freestanding, SOURCE.name, name, cwd=HERE,
                    work_dir=tmp, exports=list(SYMBOLS))
                for name in arches.RUNTIME_ARCHES}
            return {name: future.result() for name, future in futures.items()}


def build_libm(jobs: int | None = None) -> dict[str, bytes]:
    """Compile ``libm.c`` for each architecture of
    :data:`~hal_cpu.runtime.LIBM_ARCHES`.

    Returns:
        ``{"libm_<arch>.o": ELF relocatable object bytes}``.

    Raises:
        hal_cpu.buildtools.zig.ZigBuildError: ziglang missing or a build failed.
    """
    zigbuild.require_zig()
    zig = zigbuild.zig_command()
    builtins = compiler_rt_source()
    with tempfile.TemporaryDirectory(prefix="hal_cpu_libm_") as tmp:
        def one(arch: str) -> bytes:
            libm = Path(tmp) / f"{LIBM_SOURCE.stem}_{arch}_c.o"
            zigbuild.run(zig + ["cc", *LIBM_ARCHES[arch], *zigbuild.CFLAGS,
                                *LIBM_CFLAGS, "-c", LIBM_SOURCE.name,
                                "-o", str(libm)], HERE)
            crt = Path(tmp) / f"compiler_rt_{arch}.o"
            zigbuild.run(zig + ["build-obj", str(builtins),
                                *_target_flags(LIBM_ARCHES[arch]),
                                *COMPILER_RT_FLAGS, f"-femit-bin={crt}"], tmp)
            out = Path(tmp) / f"{LIBM_SOURCE.stem}_{arch}.o"
            zigbuild.run(zig + ["ld.lld", "-r", "--build-id=none", str(libm),
                                str(crt), "-o", str(out)], tmp)
            return out.read_bytes()

        with concurrent.futures.ThreadPoolExecutor(
                max_workers=jobs or os.cpu_count() or 2) as pool:
            futures = {f"{LIBM_SOURCE.stem}_{arch}.o": pool.submit(one, arch)
                       for arch in LIBM_ARCHES}
            return {name: future.result() for name, future in futures.items()}


def pack(singles: dict[str, bytes]) -> bytes:
    """The FatELF bundle of the per-architecture objects."""
    return fatelf.join(list(singles.values()), names=list(singles))


def _write(out_dir: Path | str | None, bundle: Path, singles: dict[str, bytes],
           keep_singles: bool) -> Path:
    out = Path(out_dir) if out_dir is not None else bundle.parent
    out.mkdir(parents=True, exist_ok=True)
    if keep_singles:
        for name, data in singles.items():
            (out / name).write_bytes(data)
    path = out / bundle.name
    path.write_bytes(pack(singles))
    return path


def build(out_dir: Path | str | None = None, *, jobs: int | None = None,
          keep_singles: bool = False) -> Path:
    """Build and write ``runtime.sos`` into ``out_dir`` (default: the
    package directory); returns its path. ``keep_singles`` also writes the
    per-architecture objects next to it."""
    return _write(out_dir, BUNDLE, build_singles(jobs), keep_singles)


def build_libm_bundle(out_dir: Path | str | None = None, *,
                      jobs: int | None = None, keep_singles: bool = False) -> Path:
    """Build and write ``libm.sos`` into ``out_dir`` (default: the package
    directory); returns its path. ``keep_singles`` also writes the
    per-architecture objects next to it."""
    return _write(out_dir, LIBM_BUNDLE, build_libm(jobs), keep_singles)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hal_cpu.buildtools.runtime", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=None,
                        help=f"output directory (default: {BUNDLE.parent})")
    parser.add_argument("--keep-singles", action="store_true",
                        help="also write the per-architecture objects")
    parser.add_argument("-j", "--jobs", type=int, default=None)
    parser.add_argument("--only", choices=("runtime", "libm"), default=None,
                        help="build only this bundle")
    args = parser.parse_args(argv)
    zigbuild.warn_if_other_version()
    try:
        paths = [make(args.out_dir, jobs=args.jobs, keep_singles=args.keep_singles)
                 for what, make in (("runtime", build), ("libm", build_libm_bundle))
                 if args.only in (None, what)]
    except zigbuild.ZigBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(f"{path}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
