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
    only that one's options), else None (all are built). A name that is no
    command leaves every subcommand unbuilt: the error lists the names."""
    args = sys.argv[1:] if argv is None else list(argv)
    return args[0] if args and not args[0].startswith("-") else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``hal-cpu`` parser; with ``command``, only that subcommand's
    options are built, the others are registered by name alone, to be found
    on the command line (help listing every command needs ``None``).
    Building every subcommand's options is a good part of a short command's
    start."""
    parser = ArgumentParser(
        prog="hal-cpu", description="Inspect and run IREE CPU executables "
        "(embedded ELF / FatELF), natively or emulated.",
        epilog="Exit status: 0 success, 1 error (one line on stderr), "
        "2 usage error, 130 interrupted. Long options may be spelled with "
        "_ or - between words (--cache_dir, --cache-dir).")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    # name -> parser: an unbuilt one is None, its name found on the command
    # line and listed in errors
    parsers: dict[str, Any] = sub.choices
    for name in COMMANDS:
        if command is None or name == command:
            _command(name)[0](sub)
        else:
            parsers[name] = None
    return parser


def error_line(exc) -> str:
    """``hal-cpu: error: <exc>`` as printed on stderr: control characters
    (but newline and tab) escaped, and no line after the first reading as
    one of the tool's own (:func:`fatelf.text.for_terminal`), whatever
    text of a program or guest the message quotes."""
    return for_terminal(f"hal-cpu: error: {exc}", "hal-cpu")


def main(argv=None) -> int:
    args = build_parser(_command_of(argv)).parse_args(argv)
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
