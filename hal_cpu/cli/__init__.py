"""``hal-cpu``: inspect and run IREE CPU executables and plugins.

Flags are spelled as IREE's tools spell them (``--entry_point``,
``--workgroup_count``, ``--binding``, ``--constant``,
``--executable_plugin``) so IREE users feel at home.

The subcommands live in the modules of this package, each with its parser
and what runs it (:data:`COMMANDS`): :mod:`.executables` (``inspect``,
``run``), :mod:`.modules` (``run-module``, ``check-module``,
``benchmark-module``), :mod:`.plan` (``plan``) and :mod:`.tools` (``demo``,
``profiles``, ``build-plugin``). They share :mod:`.options` (and the
program commands :mod:`.programs`), never each other. Only the module of
the subcommand being run is imported, and only its parser built.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Callable

from fatelf.errors import PortableKernelError
from fatelf.text import for_terminal

__all__ = ["COMMANDS", "ArgumentParser", "build_parser", "main", "option_key"]

#: Every subcommand, in the order help lists them, with the module of this
#: package that defines it.
COMMANDS = {
    "inspect": "executables",
    "run": "executables",
    "run-module": "modules",
    "plan": "plan",
    "check-module": "modules",
    "benchmark-module": "modules",
    "demo": "tools",
    "profiles": "tools",
    "build-plugin": "tools",
    "debug": "debug",
}


#: One line per subcommand for ``hal-cpu --help`` and usage errors that name
#: no subcommand, listed without importing the modules (each module's own
#: parser has the same text as its ``help=``; tests/test_startup.py checks).
SUMMARIES = {
    "inspect": "show an executable library or plugin without running its "
               "code on this CPU",
    "run": "dispatch one export over a workgroup grid",
    "run-module": "run a compiled IREE module (.vmfb) or an MLIR program "
                  "(compiled first) through this runtime on any architecture "
                  "and print the results as iree-run-module does",
    "plan": "compile an MLIR program and print the dispatches and transfers "
            "one call performs, with a hal-cpu run command line per dispatch",
    "check-module": "run every public function of a test program with IREE's "
                    "check ops, as iree-check-module does, on any architecture",
    "benchmark-module": "time calls of a function of a compiled module (.vmfb) "
                        "or MLIR program loaded once, as iree-benchmark-module "
                        "does, on any architecture",
    "demo": "run the bundled sample executables for every architecture and "
            "check them against numpy",
    "profiles": "list the CPU profiles --cpu accepts, with the engines that "
                "run them",
    "build-plugin": "compile a C executable plugin for several architectures "
                    "with zig (pip install ziglang) and pack a FatELF .sos",
    "debug": "run one dispatch under gdb (qemu-user's gdb stub)",
}


def option_key(option: str) -> str:
    """``--cache_dir`` and ``--cache-dir`` alike: the spelling-free key of a
    long option (``_`` and ``-`` between words are the same)."""
    return option.replace("_", "-")


def _long_options(action: argparse.Action) -> list[str]:
    return [s for s in action.option_strings if s.startswith("--")]


class _Recording:
    """An argument group of an :class:`ArgumentParser` that notes the long
    options added to it in the parser's :attr:`ArgumentParser.long_options`."""

    def __init__(self, group: Any, long_options: list[str]):
        self.group = group
        self.long_options = long_options

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = self.group.add_argument(*args, **kwargs)
        self.long_options += _long_options(action)
        return action

    def __getattr__(self, name: str) -> Any:
        return getattr(self.group, name)


class ArgumentParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose long options are taken in
    either spelling: IREE's tools write ``--cache_dir``, ``--no_progress``,
    other tools ``--cache-dir``, ``--no-progress``; both name the same
    option. Help shows the one spelling each option is registered with
    (IREE's underscores); subcommand parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any):
        #: The long options, as registered (``--help`` among them).
        self.long_options: list[str] = []
        #: A top-level parser's subcommands: name -> parser (None when not
        #: built), filled by :func:`build_parser`.
        self.subcommands: dict[str, Any] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.long_options += _long_options(action)
        return action

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        return _Recording(super().add_argument_group(*args, **kwargs),
                          self.long_options)

    def add_mutually_exclusive_group(self, **kwargs: Any) -> Any:
        return _Recording(super().add_mutually_exclusive_group(**kwargs),
                          self.long_options)

    def parse_known_args(self, args=None, namespace=None):
        if args is None:
            args = sys.argv[1:]
        return super().parse_known_args(self.respelled(list(args)), namespace)

    def respelled(self, args: list[str]) -> list[str]:
        """``args`` with every long option this parser does not know as
        spelled, but knows in the other spelling, written as it knows it
        (values and everything after ``--`` untouched)."""
        known = self.long_options
        by_key: dict[str, list[str]] = {}
        for option in known:
            by_key.setdefault(option_key(option), []).append(option)
        out = []
        for i, arg in enumerate(args):
            if arg == "--":
                out += args[i:]
                break
            if arg.startswith("--") and len(arg) > 2:
                name, sep, value = arg.partition("=")
                spelled = by_key.get(option_key(name), [])
                if name not in known and len(spelled) == 1:
                    arg = spelled[0] + sep + value
            out.append(arg)
        return out


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("portable-kernel-runtime")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``: print ``hal-cpu <version>`` and exit; the version is
    looked up (``importlib.metadata``) only when the option is given."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS,
                 default=argparse.SUPPRESS, help="show program's version "
                 "number and exit"):
        super().__init__(option_strings=option_strings, dest=dest,
                         default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            sys.stdout.write(f"hal-cpu {_version()}\n")
        except (AttributeError, OSError):
            pass
        parser.exit()


def _command(name: str) -> tuple[Callable[[Any], None], Callable[[Any], int]]:
    """(add its parser to the subparsers, run it) of subcommand ``name``,
    from the module that defines it, imported now."""
    module = importlib.import_module(f".{COMMANDS[name]}", __name__)
    return module.COMMANDS[name]


def _command_of(argv) -> str | None:
    """The subcommand when it is the first argument (the parser then needs
    only that one's options), else None. A name that is no command is None
    too: the error lists the names."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and not args[0].startswith("-") and args[0] in COMMANDS:
        return args[0]
    return None


def build_parser(command: str | None = None, *,
                 listing: bool = False) -> ArgumentParser:
    """The ``hal-cpu`` parser.

    Args:
        command: build only that subcommand's options (importing only its
            module); the others are registered by name alone, to be found
            on the command line. None: every subcommand is built (each
            module imported).
        listing: with ``command`` None, register every subcommand by name
            with its one-line summary (:data:`SUMMARIES`) and build none:
            what ``hal-cpu --help``, ``hal-cpu`` alone and an unknown
            subcommand need, without importing any module of subcommands.

    Building every subcommand's options is most of a short command's start.
    """
    parser = ArgumentParser(
        prog="hal-cpu", description="Inspect and run IREE CPU executables "
        "(embedded ELF / FatELF), natively or emulated.",
        epilog="Exit status: 0 success, 1 error (one line on stderr), "
        "2 usage error, 130 interrupted. Long options may be spelled with "
        "_ or - between words (--cache_dir, --cache-dir). "
        "hal-cpu COMMAND --help shows a command's options.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # name -> parser: an unbuilt one is None, its name found on the command
    # line and listed in errors
    parsers: dict[str, Any] = sub.choices
    #: subcommand name -> its parser (None: not built), for usage errors
    parser.subcommands = parsers
    for name in COMMANDS:
        if command is None and listing:
            sub.add_parser(name, help=SUMMARIES.get(name), add_help=False)
        elif command is None or name == command:
            _command(name)[0](sub)
        else:
            parsers[name] = None
    return parser


def _parse(argv) -> argparse.Namespace:
    """The command line parsed; a usage error exits with status 2 showing the
    usage of the subcommand given (its own parser's), or the top-level usage
    when none is."""
    args_list = sys.argv[1:] if argv is None else list(argv)
    command = _command_of(args_list)
    parser = build_parser(command, listing=command is None)
    args, extras = parser.parse_known_args(args_list)
    if extras:
        owner = parser.subcommands.get(str(getattr(args, "command", ""))) or parser
        owner.error("unrecognized arguments: " + " ".join(extras))
    return args


def error_line(exc) -> str:
    """``hal-cpu: error: <exc>`` as printed on stderr: control characters
    (but newline and tab) escaped, and no line after the first reading as
    one of the tool's own (:func:`fatelf.text.for_terminal`), whatever
    text of a program or guest the message quotes."""
    return for_terminal(f"hal-cpu: error: {exc}", "hal-cpu")


def main(argv=None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit
    status.

    Called without ``argv`` (the ``hal-cpu`` command, ``python -m
    hal_cpu``), the process is about to end with the command: the objects
    alive once the subcommand's modules are imported (numpy's, the VM's),
    and those alive when the command returns, are moved out of the
    garbage collector's reach (:func:`gc.freeze`). They live until the
    process ends anyway; the collector then no longer walks them on each
    full pass of the run, in the child a native run forks (whose memory
    stays shared with this process) or, several times, while Python ends
    (about 25 ms of CPU of a ``run-module`` of a small program on a 2-core
    x86_64).

    A command also starts numpy's OpenBLAS with one thread
    (``OPENBLAS_NUM_THREADS=1`` unless the environment says otherwise): the
    runtime computes nothing with BLAS (dispatches run the program's own
    kernels, on the runtime's workers), and OpenBLAS's other threads,
    started with numpy and spinning while they wait, cost about 50 ms of
    CPU per command on a 2-core x86_64.

    Called without ``argv``, the process also ends here once the command
    is done and no thread of its own is left running (:func:`_end`): the
    exit handlers run and the standard streams are flushed, but Python's
    teardown of every module (numpy's, the VM's: about 7 ms of CPU of a
    ``run-module``) is skipped."""
    if argv is None and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    status = _main(argv, freeze=argv is None)
    if argv is None:
        import gc
        gc.freeze()
        _end(status)
    return status


def _end(status: int) -> None:
    """End the process with ``status`` as the interpreter would, without
    tearing its modules down: the ``atexit`` handlers run (temporary
    folders removed, coverage written) and stdout and stderr are flushed
    (a reader gone away is ignored, as :func:`_main` ignores it). Returns
    (the interpreter then ends as usual) while a thread that is not a
    daemon still runs: the interpreter waits for it."""
    import threading
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon and t.is_alive()
           for t in threading.enumerate()):
        return
    import atexit
    atexit._run_exitfuncs()  # noqa: SLF001 - the exit handlers, run before os._exit
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status if isinstance(status, int) and 0 <= status <= 255 else 1)


def _main(argv, freeze: bool = False) -> int:
    if freeze:
        import gc
        gc.disable()        # imports make little garbage: no passes over them
        try:
            args = _parse(argv)
        finally:
            gc.freeze()
            gc.enable()
    else:
        args = _parse(argv)
    try:
        return _command(args.command)[1](args)
    except PortableKernelError as exc:
        print(error_line(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hal-cpu: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): end quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
