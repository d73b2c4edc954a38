"""``hal-cpu demo``, ``hal-cpu profiles`` and ``hal-cpu build-plugin``: the
bundled samples run on every architecture, the CPU profiles ``--cpu``
takes, and C plugins compiled for several architectures."""

from __future__ import annotations

import os

from fatelf import arches

from .options import arch as _arch

__all__ = ["COMMANDS", "cmd_build_plugin", "cmd_demo", "cmd_profiles"]


def _demo_parser(sub) -> None:
    p = sub.add_parser("demo", help="run the bundled sample executables for "
                       "every architecture and check them against numpy")
    p.add_argument("--arch", action="append", type=_arch, metavar="ARCH",
                   help="only these architectures (repeatable)")


def _profiles_parser(sub) -> None:
    p = sub.add_parser("profiles", help="list the CPU profiles --cpu accepts, "
                       "with the engines that run them")
    p.add_argument("--arch", action="append", type=_arch, metavar="ARCH",
                   help="only these architectures (repeatable)")
    p.add_argument("--sweep", metavar="PROFILE", default=None,
                   help="run the hal-cpu command given after -- (run, "
                   "run-module or benchmark-module) once per vector length "
                   "of PROFILE (sve, sve2, rv64gcv) with "
                   "--count_instructions, and print the instructions per "
                   "vector length")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="with --sweep: also plot them (needs matplotlib)")
    p.add_argument("sweep_command", nargs="*", metavar="-- COMMAND",
                   help="with --sweep: the hal-cpu command line to sweep")


def _build_plugin_parser(sub) -> None:
    p = sub.add_parser(
        "build-plugin", help="compile a C executable plugin for several "
        "architectures with zig (pip install ziglang) and pack a FatELF .sos",
        description="Compile C sources into a self-contained plugin for each "
        "architecture (freestanding, no libc; plugin_abi.h from "
        "hal_cpu.get_include() is on the include path) and pack the objects "
        "as one FatELF bundle; or, for one architecture written to a .so, "
        "write the ELF itself.")
    p.add_argument("sources", nargs="+", metavar="SOURCE.c")
    p.add_argument("-o", "--output", required=True, metavar="PLUGIN.sos",
                   help="the bundle (.sos), or for one architecture and one "
                   "profile a plain ELF (.so)")
    p.add_argument("--arch", default="all", metavar="ARCHES",
                   help="all (default), or a comma-separated list of "
                   "architectures (aliases accepted)")
    p.add_argument("--cpu", default=None, metavar="PROFILES",
                   help="CPU profiles, comma-separated: ARCH:PROFILE or a "
                   "profile name, each for its own architecture, e.g. "
                   "x86_64:x86-64-v3,aarch64:sve,riscv64:rv64gcv (others get "
                   "their baseline; hal-cpu profiles lists them). An "
                   "architecture named twice (aarch64:armv8-a,aarch64:sve) "
                   "gets a record per profile: the first is what loaders pick "
                   "by default, pytest --hal-cpu picks by profile")
    p.add_argument("-g", dest="debug", action="store_true",
                   help="keep symbols and DWARF line tables, for fault "
                   "reports with static function names and source lines")
    p.add_argument("-I", dest="include", action="append", default=[],
                   metavar="DIR", help="more include directories")
    p.add_argument("-D", dest="define", action="append", default=[],
                   metavar="NAME[=VALUE]", help="preprocessor definitions")


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(args.arch)


def cmd_build_plugin(args) -> int:
    from ..buildtools import zig as zigbuild
    labels = zigbuild.build_plugin_file(
        args.sources, args.output, args.arch, cpu=args.cpu, debug=args.debug,
        include_dirs=args.include, defines=[f"-D{d}" for d in args.define])
    kind = "ELF" if args.output.endswith(".so") else "FatELF"
    print(f"{args.output}: {os.path.getsize(args.output)} bytes, {kind}, "
          + ", ".join(labels))
    return 0


def cmd_profiles(args) -> int:
    if args.sweep or args.sweep_command or args.plot:
        from ..workbench import WorkbenchError, sweep
        from . import main
        if not args.sweep:
            raise WorkbenchError("a command or --plot needs --sweep PROFILE",
                                 field="--sweep", value=None)
        rows = sweep.sweep(args.sweep, args.sweep_command, main)
        print(sweep.table(rows))
        if args.plot:
            sweep.plot(rows, args.plot, f"{args.sweep}: " + " ".join(
                os.path.basename(a) for a in args.sweep_command[:2]))
        return 0
    from elfloader.backend.emulated.choice import qemu_program
    names = args.arch or list(arches.RUNTIME_ARCHES)
    print(f"{'arch':<8} {'profile':<24} {'engines':<14} {'vector lengths':<26} "
          "ISA")
    for name in names:
        have_qemu = qemu_program(name) is not None
        for p in arches.profiles(name):
            runs = ["qemu" + ("" if have_qemu else " (not installed)")]
            if p.unicorn:
                runs.append("unicorn")
            default = " (default)" if arches.DEFAULT_PROFILES.get(name) == p.name else ""
            vl = ", ".join(str(v) for v in sorted(p.vlens)) or "-"
            print(f"{name:<8} {p.name:<24} {' '.join(runs):<14} {vl:<26} "
                  f"{p.summary}{default}")
            if p.note:
                print(f"{'':<8} {'':<24} note: {p.note}")
    return 0


#: Subcommand -> (add its parser to the ``hal-cpu`` subparsers, run it).
COMMANDS = {"demo": (_demo_parser, cmd_demo),
            "profiles": (_profiles_parser, cmd_profiles),
            "build-plugin": (_build_plugin_parser, cmd_build_plugin)}
