"""``hal-cpu``: inspect and run IREE CPU executables and plugins.

Flags are spelled as IREE's tools spell them (``--entry_point``,
``--workgroup_count``, ``--binding``, ``--constant``,
``--executable_plugin``) so IREE users feel at home.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from fatelf.errors import PortableKernelError

import elfloader

from .buffers import format_buffer_view, parse_binding
from .errors import HalCpuError


def _triple(text: str) -> tuple[int, int, int]:
    parts = [p for p in text.replace(" ", "").split(",") if p]
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected X,Y,Z, got {text!r}")
    vals = [int(p) for p in parts] + [1] * (3 - len(parts))
    return tuple(vals)


def _u32(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= v < 1 << 32:
        raise argparse.ArgumentTypeError(f"{text} does not fit uint32")
    return v


def _output(text: str) -> tuple[int, str]:
    index, sep, path = text.partition("=")
    if not sep or not index.isdigit() or not path.startswith("@"):
        raise argparse.ArgumentTypeError(
            f"expected BINDING_INDEX=@file.npy, got {text!r}")
    return int(index), path[1:]


def _add_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=elfloader.backend.KINDS, default="auto",
                   help="native (host architecture only), emulated, or auto "
                        "(native when the file matches the host)")
    p.add_argument("--arch", choices=elfloader.arch.names(),
                   help="architecture the file must be for / to select from "
                        "a FatELF bundle")
    p.add_argument("--executable_plugin", action="append", default=[],
                   metavar="SPEC", help="plugin resolving imports: path.sos, "
                   "embedded:path, a system library path, with optional "
                   "?key=value&... load parameters (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hal-cpu", description="Inspect and run IREE CPU executables "
        "(embedded ELF / FatELF), natively or emulated.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="show an executable library or plugin")
    p.add_argument("file")
    p.add_argument("--resolve", action="append", default=[], metavar="NAME",
                   help="for a plugin: import names to resolve")
    _add_target_flags(p)

    p = sub.add_parser("run", help="dispatch one export over a workgroup grid")
    p.add_argument("file")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--function", help="export name")
    which.add_argument("--entry_point", type=int, help="export ordinal")
    p.add_argument("--workgroup_count", type=_triple, default=(1, 1, 1),
                   metavar="X,Y,Z")
    p.add_argument("--binding", action="append", default=[], metavar="SPEC",
                   help="4xf32=1,2,3,4 | 4xf32=0 | 2x8xi32 | @file.npy | "
                        "4xf32=@raw.bin (repeatable, in binding order)")
    p.add_argument("--constant", action="append", default=[], type=_u32,
                   metavar="U32", help="push constant (repeatable)")
    p.add_argument("--output", action="append", default=[], type=_output,
                   metavar="I=@file.npy", help="save binding I after the "
                   "dispatch (repeatable)")
    _add_target_flags(p)

    p = sub.add_parser("demo", help="run the bundled sample executables for "
                       "every architecture and check them against numpy")
    p.add_argument("--arch", action="append", choices=elfloader.arch.names(),
                   help="only these architectures (repeatable)")
    return parser


def _plugins(args, arch_hint):
    if not args.executable_plugin:
        return None
    from .plugins import PluginManager
    return PluginManager.from_specs(args.executable_plugin, arch=arch_hint,
                                    backend=args.backend)


def _file_arch(args):
    """Architecture the file will run as (for plugin managers)."""
    image = elfloader.read_image(args.file, arch=args.arch)
    return image.arch


def cmd_inspect(args) -> int:
    from .library import Executable
    from . import abi
    from .plugins import inspect_plugin
    try:
        image = elfloader.read_image(args.file, arch=args.arch)
    except elfloader.UnsupportedElfError as exc:
        if exc.field != "DT_NEEDED":
            raise
        # Linked against system libraries: only a system plugin can be that.
        print(inspect_plugin(args.file, resolve=args.resolve, system=True))
        return 0
    arch = image.arch
    if abi.PLUGIN_QUERY in image.exports:
        print(inspect_plugin(args.file, arch=arch, backend=args.backend,
                             resolve=args.resolve))
        return 0
    with Executable(args.file, arch=arch, backend=args.backend,
                    plugins=_plugins(args, arch)) as exe:
        print(describe(exe))
    return 0


def describe(exe) -> str:
    """Human-readable summary of an :class:`Executable`."""
    lines = [
        f"file:         {exe.path}",
        f"architecture: {exe.arch.name} ({exe.arch.elf_class}-bit, "
        f"{exe.backend.kind})",
        f"library:      {exe.name} (version {exe.version:#x}, features "
        f"{exe.features:#x}, sanitizer {exe.sanitizer})",
        f"constants:    {exe.constant_count}",
        f"imports:      {len(exe.imports)}",
    ]
    lines += [f"  [{i}] {n}{'  (optional)' if n.startswith('?') else ''}"
              for i, n in enumerate(exe.imports)]
    lines.append(f"exports:      {len(exe.exports)}")
    for e in exe.exports:
        lines.append(f"  [{e.ordinal}] {e.label}" + (f"  tag={e.tag}" if e.tag else ""))
        lines.append(f"      workgroup_size={'x'.join(map(str, e.workgroup_size))} "
                     f"constants={e.constant_count} bindings={e.binding_count} "
                     f"local_memory_pages={e.local_memory_pages} "
                     f"flags={e.flags:#x} parameters={e.parameter_count}")
    return "\n".join(lines)


def cmd_run(args) -> int:
    from .library import Executable
    arrays = [parse_binding(s) for s in args.binding]
    arch = _file_arch(args)
    with Executable(args.file, arch=arch, backend=args.backend,
                    plugins=_plugins(args, arch)) as exe:
        export = args.function if args.function is not None else args.entry_point
        exe.dispatch(export, args.workgroup_count, arrays, args.constant)
    for i, path in args.output:
        if not 0 <= i < len(arrays):
            raise HalCpuError(f"no binding {i} ({len(arrays)} bindings)",
                              field="--output", value=i)
        np.save(path, arrays[i])
    for a in arrays:
        print(format_buffer_view(a))
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(args.arch)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"inspect": cmd_inspect, "run": cmd_run,
                "demo": cmd_demo}[args.command](args)
    except PortableKernelError as exc:
        print(f"hal-cpu: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
