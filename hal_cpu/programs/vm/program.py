"""Programs of VM modules: link once, call many.

:func:`load_program` reads one or more ``.vmfb`` files, links them as
IREE's VM context does and returns a :class:`Program` whose functions take
and return numpy arrays::

    >>> from hal_cpu.programs.vm import load_program                     # doctest: +SKIP
    >>> with load_program("mlp.vmfb") as prog:                  # doctest: +SKIP
    ...     (probs,) = prog("predict", x)

Linking rules (those of IREE's VM context, ``runtime/src/iree/vm/context.c``):

* modules are registered in order: the ``hal`` module first, then the
  built-in ``check`` module, the host modules, and the bytecode modules in
  the order given; a module's imports resolve against the modules
  registered before it, newest registration first;
* an import is ``<module>.<function>``; an optional import (``?`` in
  ``iree-dump-module``'s listing, e.g. a ``vm.fallback``) that nothing
  provides is left unresolved and the program takes its fallback path; any
  other missing import is a :class:`LinkError` naming it before anything
  runs;
* a bytecode module's export called through an import must have the
  import's calling convention (:class:`LinkError` otherwise);
* a module dependency (``hal, version >= 7``) needs a registered module of
  that name and at least that version;
* each bytecode module's ``__init`` runs once, when it is linked, and its
  ``__deinit`` when the program closes.

Host modules are :class:`hal_cpu.programs.HostModule` objects (or anything with
``name``, ``functions`` and optionally ``types`` and ``version``); their
functions see ``!hal.buffer_view`` arguments as numpy arrays, ``!vm.buffer``
as :class:`bytes`, other refs as the objects themselves, and may return
numpy arrays where a buffer view is expected.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import time
import traceback
from typing import Callable, Mapping, Sequence

import numpy as np

from fatelf import arches
from fatelf.text import printable

from ...errors import HalCpuError
from .decode import BytecodeError
from .refs import RESOURCE_EXHAUSTED, VmBuffer, VmError, VmStatusError

__all__ = ["LinkError", "ProgramTimeoutError", "Program", "Function",
           "InputMismatchError", "input_mismatch", "load_program", "module_arch"]


class ProgramTimeoutError(VmError):
    """A call of a program's function ran past its time limit
    (:attr:`Program.timeout`): the host code stopped at a backward branch
    of the bytecode, or a dispatch at its own limit. ``function`` is the
    VM function that was running, ``seconds`` the limit."""

    def __init__(self, message: str, *, seconds: float, function: str, **kw):
        super().__init__(message, **kw)
        self.seconds, self.function = seconds, function


class LinkError(VmError):
    """Modules that cannot be linked: a required import no module provides,
    a calling convention that differs between an import and the export it
    resolves to, a dependency missing or too old, a ref type no module
    declares."""


def module_arch(mdef) -> str | None:
    """The architecture (our canonical name) of the executables a module
    embeds, from its ``embedded-elf-<arch>`` format strings; None when it
    names none. The first such string wins."""
    prefix = b"embedded-elf-"
    for seg in mdef.rodata:
        if seg.size > 64:
            continue
        data = bytes(mdef.rodata_bytes(seg.index))
        if data.startswith(prefix):
            try:
                return arches.lookup(data[len(prefix):].decode("ascii")).name
            except Exception:
                continue
    return None


# ---------------------------------------------------------------------------
# modules in a context

class _Linked:
    """A module registered in a program: ``name``, ``version`` and
    ``exports`` (function name without the module prefix ->
    ``(cconv or None, callable)``; None when any convention is taken)."""

    def __init__(self, name: str, version: int, exports: dict, types=()):
        self.name, self.version, self.exports = name, version, exports
        self.types = set(types)


def _hal_linked(hal) -> _Linked:
    exports = {full[4:] if full.startswith("hal.") else full: entry
               for full, entry in hal.exports.items()}
    return _Linked("hal", int(getattr(hal, "version", 0)), exports)


def _to_host(hal, value):
    """A VM value as a host module sees it."""
    if value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, VmBuffer):
        return value.bytes()
    if getattr(value, "vm_type", None) == "!hal.buffer_view":
        return hal.to_numpy(value)
    return value


def _from_host(hal, value, ty: str, what: str, classes: tuple = ()):
    if ty in ("i", "I"):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise _host_error(f"{what} is {value!r}; expected an integer")
        bits = 32 if ty == "i" else 64
        v = int(value) & ((1 << bits) - 1)
        return v - (1 << bits) if v >> (bits - 1) else v
    if ty in ("f", "F"):
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise _host_error(f"{what} is {value!r}; expected a number")
        return float(np.float32(value)) if ty == "f" else float(value)
    if isinstance(value, np.ndarray):
        return hal.wrap_input(value)
    if isinstance(value, (bytes, bytearray)):
        return VmBuffer(bytes(value), True, what)
    if (value is None or getattr(value, "vm_type", None) is not None
            or (classes and isinstance(value, classes))):
        return value
    raise _host_error(f"{what} is {value!r:.80} ({type(value).__name__}): not a "
                      "numpy array, bytes, or an object of a type the module "
                      "declares")


def _host_status(exc: Exception, label: str):
    """A host function's Python exception as the status an IREE C module
    returns: ``CODE; message; while invoking native function <label>``
    (IREE's words). A message starting with a status name and ``; ``
    (``UNKNOWN; Forced failure``) gives that code; any other is UNKNOWN,
    its text kept (prefixed by the exception's type unless a bare
    ``RuntimeError``)."""
    from ..host_api import StatusCode, StatusError
    text = printable(str(exc))
    head, sep, rest = text.partition("; ")
    code = StatusCode.__members__.get(head.strip()) if sep else None
    if code is None or not code:
        code, rest = StatusCode.UNKNOWN, text
        if type(exc) is not RuntimeError or not text:
            rest = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return StatusError(code, f"{rest}; while invoking native function "
                       f"{printable(label)}")


def _host_error(message: str):
    from ..host_modules import HostCallError
    return HostCallError(message)


def _host_linked(module, hal) -> _Linked:
    """A Python host module as a registered module: each function adapted to
    the VM calling convention when an import links to it."""
    name = getattr(module, "name", None)
    functions = getattr(module, "functions", None)
    if not isinstance(name, str) or not name:
        raise LinkError(f"host module {module!r} has no name", field="module",
                        value=repr(module))
    if not isinstance(functions, Mapping):
        raise LinkError(f"host module '{name}': 'functions' is "
                        f"{type(functions).__name__}, not a mapping of names to "
                        "callables", name=name, field="functions",
                        value=type(functions).__name__)
    exports = {}
    drops_device = name == "check"
    declared = getattr(module, "types", None) or {}
    classes = tuple(c for c in declared.values() if isinstance(c, type))
    for fname, fn in functions.items():
        if not callable(fn):
            raise LinkError(f"host module '{name}': function '{fname}' is "
                            f"{fn!r}, not callable", name=name, field="functions",
                            value=fname)
        exports[fname] = (None, _HostFunction(name, fname, fn, hal,
                                              drops_device, classes))
    types = {f"!{t}" for t in declared}
    try:
        version = int(getattr(module, "version", 0) or 0)
    except (TypeError, ValueError):
        raise LinkError(f"host module '{name}': version is "
                        f"{getattr(module, 'version', None)!r}", name=name,
                        field="version", value=repr(getattr(module, "version", None))) from None
    return _Linked(name, version, exports, types)


class _HostFunction:
    """A host function, called through an import of calling convention
    ``cconv`` (bound by :meth:`bind`)."""

    def __init__(self, module: str, name: str, fn, hal, drops_device: bool,
                 classes: tuple = ()):
        self.module, self.name, self.fn, self.hal = module, name, fn, hal
        self.drops_device = drops_device
        #: the classes of the module's own ref types: a ref result must be
        #: one of them, an array, bytes or a VM or HAL object
        self.classes = classes

    def bind(self, cconv: str) -> Callable:
        args, results = _parse_cconv(cconv, f"import @{self.module}.{self.name}")
        fn, hal, label = self.fn, self.hal, f"{self.module}.{self.name}"
        classes = self.classes
        skip = 1 if (self.drops_device and args[:1] == ["r"]
                     and self.name != "expect_true" and self.name != "expect_false") else 0

        def call(*vm_args):
            host_args = [_to_host(hal, a) for a in vm_args[skip:]]
            try:
                out = fn(*host_args)
            except VmError:
                raise
            except Exception as e:
                from ..errors import EvaluationError
                if isinstance(e, EvaluationError):
                    raise
                raise _host_status(e, label) from None
            if not results:
                return None
            if len(results) == 1:
                return _from_host(hal, out, results[0], f"the result of @{label}",
                                  classes)
            if not isinstance(out, (tuple, list)) or len(out) != len(results):
                raise _host_error(f"@{label} returned {out!r:.80}; it must return "
                                  f"{len(results)} values")
            return tuple(_from_host(hal, v, t, f"result {i} of @{label}", classes)
                         for i, (v, t) in enumerate(zip(out, results)))
        call.__name__ = label
        return call


def _parse_cconv(cconv: str, what: str, label: str | None = None):
    """:func:`~hal_cpu.programs.vm.translate.parse_cconv`, a malformed calling
    convention a :class:`LinkError` naming ``what``."""
    from .translate import parse_cconv
    try:
        return parse_cconv(cconv)
    except ValueError as exc:
        raise LinkError(f"{printable(what)}: {printable(str(exc))}", name=label,
                        field="cconv", value=printable(cconv)) from None


# ---------------------------------------------------------------------------
# bytecode modules

class _BytecodeModule:
    """A linked bytecode module: its definition, environment and translated
    functions."""

    def __init__(self, mdef, env, label: str):
        self.mdef, self.env, self.label = mdef, env, label
        self.exports = {e.name: e for e in mdef.exports}

    def linked(self) -> _Linked:
        ex = {}
        for name, e in self.exports.items():
            fn = self.env.functions[e.function]
            ex[name] = (e.cconv or self.mdef.functions[e.function].cconv, fn)
        return _Linked(self.mdef.name, self.mdef.version, ex, self.mdef.types)


def _resolve(imp, registered: list[_Linked], label: str):
    module, _, fname = imp.name.partition(".")
    for reg in reversed(registered):
        if reg.name != module or fname not in reg.exports:
            continue
        cconv, fn = reg.exports[fname]
        if isinstance(fn, _HostFunction):
            return fn.bind(imp.cconv)
        if cconv is not None and cconv != imp.cconv:
            raise LinkError(f"import @{printable(imp.name)} has calling convention "
                            f"{printable(imp.cconv)}, but module "
                            f"'{printable(reg.name)}' exports it as "
                            f"{printable(cconv)}", name=label,
                            field=f"import {printable(imp.name)}",
                            value=printable(cconv))
        return fn
    if imp.optional:
        return None
    from ..host_modules import missing_module_hint
    have = ", ".join(sorted({r.name for r in registered})) or "none"
    raise LinkError(f"the program imports @{printable(imp.name)}, which no "
                    f"registered module provides (modules: {printable(have)})"
                    + ("" if module in {r.name for r in registered} else
                       f"; {missing_module_hint(module)}"),
                    name=label, field="import", value=printable(imp.name))


def _check_dependencies(mdef, registered: list[_Linked], label: str) -> None:
    from ..host_modules import missing_module_hint
    for dep in mdef.dependencies:
        found = [r for r in registered if r.name == dep.name]
        if not found:
            if dep.optional:
                continue
            raise LinkError(f"the program needs module '{printable(dep.name)}' "
                            f"(version >= {dep.minimum_version}), which is not "
                            f"registered; {missing_module_hint(dep.name)}",
                            name=label, field="dependency",
                            value=printable(dep.name))
        newest = found[-1]
        if newest.version < dep.minimum_version and not dep.optional:
            raise LinkError(f"the program needs module '{printable(dep.name)}' version >= "
                            f"{dep.minimum_version}; the registered one is "
                            f"version {newest.version}", name=label,
                            field="dependency", value=newest.version)


def _check_types(mdef, registered: list[_Linked], label: str) -> None:
    known = set()
    for r in registered:
        known |= r.types
    for ty in mdef.types:
        if not ty.startswith("!") or ty.startswith(("!hal.", "!vm.", "!util.")):
            continue
        if ty not in known:
            raise LinkError(f"the program uses type {printable(ty)}, which no "
                            "registered module declares", name=label, field="type",
                            value=printable(ty))


def _link_bytecode(mdef, registered: list[_Linked], label: str,
                   memory=None) -> _BytecodeModule:
    from . import translate as tr
    _check_dependencies(mdef, registered, label)
    _check_types(mdef, registered, label)
    env = tr.Env.for_module(
        mdef, imports=[_resolve(imp, registered, label) for imp in mdef.imports],
        functions=[None] * len(mdef.functions), memory=memory)
    # every function translated (or its translation read from the cache)
    tr.translate_module(mdef, env, module_name=mdef.name)
    return _BytecodeModule(mdef, env, label)


# ---------------------------------------------------------------------------
# time limits: a deadline per thread, checked at backward branches

_calls = threading.local()

#: what :func:`_raise_call_error` turns into the error a call raises
#: (ctypes reports an error raised while it converts an argument, such as
#: the recursion limit reached there, as an ArgumentError naming it)
_CALL_FAILURES = (RecursionError, MemoryError, HalCpuError, ctypes.ArgumentError)


def _check_deadline() -> None:
    deadline = getattr(_calls, "deadline", None)
    if deadline is None or time.monotonic() < deadline:
        return
    frame = sys._getframe(1)  # noqa: SLF001 - CPython's frame access, the caller's name
    name = frame.f_globals.get("_vm_name") or frame.f_code.co_name
    program = _calls.program
    _calls.deadline = None      # report once; the exception unwinds the call
    raise ProgramTimeoutError(
        f"the time limit of {program.timeout:g} s passed in "
        f"{_vm_function_name(name)} (a loop of the program's host code)",
        name=program.label, field="timeout", value=program.timeout,
        seconds=program.timeout, function=_vm_function_name(name))


def _vm_function_name(name: str) -> str:
    # a translated function's namespace names it <module>.<function>
    # (printable), its code vm_f<ordinal>
    return "@" + name.partition(".")[2] if "." in name else name


def _install_hook() -> None:
    from .translate import BACKEDGE_HOOK
    BACKEDGE_HOOK[0] = _check_deadline


# ---------------------------------------------------------------------------
# the program

class Function:
    """A public function of a :class:`Program`: call it with one value per
    argument (numpy arrays for tensors, ints and floats for scalars); it
    returns a list of results (numpy arrays for tensors, numpy scalars for
    scalars).

    A function compiled with ``--iree-execution-model=async-external``
    (reflection attribute ``iree.abi.model = "coarse-fences"``) takes a
    wait fence and a signal fence after its arguments: a call passes a
    wait fence already reached and a new signal fence, and waits on it
    before returning, as IREE's tools do
    (``iree_tooling_append_async_fences``); the fences are not among
    :attr:`arg_types`.

    Attributes:
        name: the export's name; cconv: its calling convention;
        declaration: the source signature IREE records
            (``iree.abi.declaration``), or None; model: ``iree.abi.model``
            (``coarse-fences``), or None.
    """

    def __init__(self, program: "Program", name: str, cconv: str, fn: Callable,
                 declaration: str | None, model: str | None = None):
        self.program, self.name, self.cconv, self._fn = program, name, cconv, fn
        self.declaration, self.model = declaration, model
        self.arg_types, self.result_types = _parse_cconv(
            cconv, f"export @{name}", program.label)
        hal = program.hal
        if model == "coarse-fences":
            if self.arg_types[-2:] != ["r", "r"]:
                raise LinkError(f"export @{printable(name)} is coarse-fences "
                                "but its calling convention ends without a "
                                "wait and a signal fence", name=program.label,
                                field="iree.abi.model", value=printable(cconv))
            self.arg_types = self.arg_types[:-2]
            self._fn = _with_fences(fn, hal)
        # per argument: a fast conversion for the common case (a numpy
        # array for a ref), the general one otherwise
        wrap = hal.wrap_input
        ndarray = np.ndarray

        def converter(index: int, ty: str):
            if ty == "r":
                def convert(v):
                    if type(v) is ndarray:
                        return wrap(v)
                    return _argument(hal, v, ty, index, name)
            else:
                def convert(v):
                    return _argument(hal, v, ty, index, name)
            return convert
        self._convert = [converter(i, t) for i, t in enumerate(self.arg_types)]
        # (one ref argument: a numpy array wrapped without the converter)
        self._wrap1 = wrap if list(self.arg_types) == ["r"] else None
        to_numpy = hal.to_numpy

        def out_converter(ty: str):
            if ty == "r":
                def convert(v):
                    if getattr(v, "vm_type", None) == "!hal.buffer_view":
                        return to_numpy(v)
                    return _result(hal, v, ty, name)
                return convert
            return lambda v: _result(hal, v, ty, name)
        self._results = [out_converter(t) for t in self.result_types]
        # (one ref result: a buffer view read without the converter)
        from .hal_module import BufferView
        self._view1 = ((to_numpy, BufferView) if list(self.result_types) == ["r"]
                       else None)
        self._lock = program.lock

    def __call__(self, *inputs) -> list:
        program = self.program
        if program.closed:
            raise VmError("the program is closed", name=program.label,
                          field="function", value=self.name)
        convert = self._convert
        if len(inputs) != len(convert):
            raise TypeError(f"@{self.name} takes {len(self.arg_types)} arguments "
                            f"({self.declaration or self.cconv}); got {len(inputs)}")
        lock = self._lock
        lock.acquire()
        args: tuple | list
        try:
            try:
                if self._wrap1 is not None and type(inputs[0]) is np.ndarray:
                    args = (self._wrap1(inputs[0]),)
                elif len(convert) == 1:
                    args = (convert[0](inputs[0]),)
                else:
                    args = [c(v) for c, v in zip(convert, inputs)]
            except VmError as exc:
                if exc.name is None:
                    raise exc.with_name(program.label) from None
                raise
            out = program.run_function(self._fn, args, self.name)
            view1 = self._view1
            if view1 is not None and type(out) is view1[1]:
                return [view1[0](out)]
            results = self._results
            if len(results) == 1:
                return [results[0](out)]
            if not results:
                return []
            return [c(v) for c, v in zip(results, out)]
        finally:
            lock.release()

    def call_vm(self, *inputs):
        """Call with the arguments converted as a call does (VM values such
        as a ``!hal.buffer_view`` pass as they are) and return the results
        as the VM gives them: buffer views not read (None, one value, or a
        tuple). A record-only call (:mod:`hal_cpu.programs.vm.plan`) uses it."""
        program = self.program
        if len(inputs) != len(self._convert):
            raise TypeError(f"@{self.name} takes {len(self.arg_types)} arguments "
                            f"({self.declaration or self.cconv}); got {len(inputs)}")
        with program.lock:
            args = [c(v) for c, v in zip(self._convert, inputs)]
            return program.run_function(self._fn, args, self.name)

    def prepared_call(self, *inputs) -> tuple:
        """``(call, args)``: ``inputs`` converted once, as :meth:`call_vm`
        converts them (a numpy array -> a new ``!hal.buffer_view``), and a
        callable such that ``call(*args)`` runs the function as
        :meth:`call_vm` does (the program's lock, its time limit, its
        errors), without converting again: what a benchmark loop calls.

        Raises:
            TypeError: not as many inputs as the function takes, or one of
                the wrong kind; VmError: an input the module cannot hold."""
        if len(inputs) != len(self._convert):
            raise TypeError(f"@{self.name} takes {len(self.arg_types)} arguments "
                            f"({self.declaration or self.cconv}); got {len(inputs)}")
        program = self.program
        with program.lock:
            args = tuple(c(v) for c, v in zip(self._convert, inputs))
        run, lock, fn, name = program.run_function, program.lock, self._fn, self.name

        def call(*args):
            with lock:
                return run(fn, args, name)
        return call, args

    def __repr__(self) -> str:
        return f"<function @{self.name} {self.declaration or self.cconv}>"


def _raise_call_error(program: Program, exc: BaseException, name: str) -> None:
    """Raise the error the caller of ``program``'s function ``name`` gets
    when the call raised ``exc`` (one of :data:`_CALL_FAILURES`); return
    when that is ``exc`` itself (the caller re-raises it)."""
    if isinstance(exc, RecursionError) or (
            isinstance(exc, ctypes.ArgumentError)
            and "RecursionError:" in str(exc)):
        raise VmStatusError(8, f"@{name}: the program's calls nest too "
                            "deeply (the VM's call stack is exhausted)",
                            name=program.label) from None
    if isinstance(exc, MemoryError):
        raise VmStatusError(8, f"@{name}: the host has no memory for the "
                            "program's values", name=program.label) from None
    if isinstance(exc, VmError):
        # the failed call's frames let go of its values (buffers, lists)
        # now, not when the caller drops the error
        traceback.clear_frames(exc.__traceback__)
        if isinstance(exc, VmStatusError):
            mismatch = input_mismatch(exc, name)
            if mismatch is not None:
                raise mismatch.with_name(exc.name or program.label) from None
            if exc.code == RESOURCE_EXHAUSTED and f"@{name}" not in exc.message:
                # a buffer past the memory limit: say in which call
                err = type(exc).__new__(type(exc))
                err.__dict__.update(exc.__dict__)
                VmStatusError.__init__(err, exc.code, f"{exc.message} (in @{name})",
                                       exc.location, name=exc.name or program.label)
                raise err from None
        if exc.name is None:
            raise exc.with_name(program.label) from None
        return
    # an executable of the module, loaded from its bytes, names no file:
    # the module's does
    if isinstance(exc, HalCpuError) and exc.name in (None, "<memory>"):
        raise exc.with_name(program.label) from None


def _with_fences(fn: Callable, hal) -> Callable:
    """``fn`` of a coarse-fences function called as a synchronous one: its
    arguments followed by a wait fence already reached and a new signal
    fence, which is awaited (without a time limit, as IREE's tools wait)
    before the results are returned; a signal fence the program failed
    raises its status."""
    from .hal_module import Fence

    def call(*args):
        signal = Fence()
        out = fn(*args, Fence(None, 0), signal)
        hal.fence_await(-1, 0, ((signal,),))
        return out
    return call


class InputMismatchError(VmStatusError):
    """An input a function's own check rejects (``hal.buffer_view.assert``
    on an argument: shape, element type or encoding): the message names the
    function (``@name``), the input (``input<N>``, from 0) and, for a shape,
    the expected and actual shapes as lists (``[53, 29]``); status
    INVALID_ARGUMENT, ``location`` the op's source line when known."""


_INPUT_CHECK = re.compile(r"input\d+ (shape|element type|encoding) ")
_SHAPE_TEXT = re.compile(r"`(\d*(?:x\d+)*)`")


def input_mismatch(exc: VmStatusError, fname: str) -> InputMismatchError | None:
    """``exc`` as an :class:`InputMismatchError` naming function ``fname``
    when it is a rejected argument of the call (IREE's wording kept, shapes
    written as lists), else None."""
    if exc.code != 3 or not _INPUT_CHECK.match(exc.message):
        return None

    def as_list(m: re.Match) -> str:
        dims = m.group(1)
        return "[" + ", ".join(dims.split("x")) + "]" if dims else "[]"
    message = f"@{fname}: " + _SHAPE_TEXT.sub(as_list, exc.message)
    return InputMismatchError(exc.code, message, exc.location, name=exc.name)


def _argument(hal, value, ty: str, index: int, fname: str):
    if ty == "r":
        if getattr(value, "vm_type", None) is not None:
            return value
        if isinstance(value, (bytes, bytearray)):
            return VmBuffer(bytes(value), True, f"argument {index}")
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise TypeError(f"argument {index} of @{fname} is a tensor; pass a numpy "
                            f"array, not {type(value).__name__}")
        return hal.wrap_input(np.asarray(value))
    if hasattr(value, "shape") and np.ndim(value) != 0:
        raise TypeError(f"argument {index} of @{fname} is a scalar ({ty}); got an "
                        f"array of shape {np.shape(value)}")
    if ty in ("i", "I"):
        if isinstance(value, (float, np.floating)):
            raise TypeError(f"argument {index} of @{fname} is an integer; got "
                            f"{value!r}")
        bits = 32 if ty == "i" else 64
        v = int(value) & ((1 << bits) - 1)
        return v - (1 << bits) if v >> (bits - 1) else v
    if ty in ("f", "F"):
        return float(np.float32(value)) if ty == "f" else float(value)
    raise TypeError(f"argument {index} of @{fname} has type {ty!r}, which "
                    "cannot be passed from Python")


_INT_RESULTS = {"i": (32, np.int32), "I": (64, np.int64)}
_FLOAT_RESULTS = {"f": np.float32, "F": np.float64}


def _result(hal, value, ty: str, fname: str = "?"):
    """A function's result as the caller gets it. A register holds bits:
    an integer result is wrapped to its width (a hostile function may
    return a 64-bit value for an ``i32`` result); a value of another kind
    than the calling convention says is a :class:`BytecodeError`."""
    if ty in _INT_RESULTS:
        if not isinstance(value, (int, np.integer)):
            raise _bad_result(value, ty, fname)
        bits, dtype = _INT_RESULTS[ty]
        v = int(value) & ((1 << bits) - 1)
        return dtype(v - (1 << bits) if v >> (bits - 1) else v)
    if ty in _FLOAT_RESULTS:
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise _bad_result(value, ty, fname)
        return _FLOAT_RESULTS[ty](value)
    if getattr(value, "vm_type", None) == "!hal.buffer_view":
        return hal.to_numpy(value)
    if isinstance(value, VmBuffer):
        return value.bytes()
    return value


def _bad_result(value, ty: str, fname: str) -> BytecodeError:
    return BytecodeError(f"returns a {type(value).__name__} where its calling "
                         f"convention has a {ty!r} result", function=printable(fname),
                         value=type(value).__name__)


class Program:
    """Linked VM modules ready to call; build with :func:`load_program`.

    Attributes:
        label: the main (last) module's file, for messages.
        arch: the architecture its executables run as.
        hal: the :class:`hal_cpu.programs.vm.hal_module.HalModule` serving it.
        functions: public function name -> :class:`Function` of the last
            module (exports whose names start with ``__`` are left out).
        modules: the module definitions, in registration order.

        timeout: seconds one call may take, or None (no limit; the
            default). Settable. Host code is stopped at the next backward
            branch of the bytecode past the limit and each dispatch at the
            limit (:class:`ProgramTimeoutError`,
            :class:`hal_cpu.errors.CallTimeoutError`); a call into a Python
            host module is not interrupted (its code runs to its end).

    Thread-safe: calls are serialized. Close it (or use ``with``) to run
    the modules' ``__deinit`` and unload the executables.
    """

    timeout: float | None = None

    def __init__(self, mdefs: Sequence, labels: Sequence[str], hal,
                 host_modules: Sequence = (), check: bool = True,
                 timeout: float | None = None):
        self.hal, self.label = hal, labels[-1]
        self.timeout = timeout
        arch = getattr(hal, "arch", None)
        self.arch = getattr(arch, "name", arch)
        self.modules = list(mdefs)
        #: held while a function of the program runs (one call at a time)
        self.lock = threading.RLock()
        #: :meth:`close` was called
        self.closed = False
        self._bytecode: list[_BytecodeModule] = []
        self.check = None
        try:
            registered = [_hal_linked(hal)]
            if check:
                from ..check import CheckModule
                self.check = CheckModule()
                registered.append(_host_linked(self.check, hal))
            # installed entry-point modules the program imports and nobody
            # gave, registered first (given modules win)
            from ..host_modules import installed_modules
            host_modules = [*installed_modules(mdefs, [
                *(["check"] if check else []),
                *(getattr(m, "name", "") for m in host_modules)]), *host_modules]
            for m in host_modules:
                registered.append(_host_linked(m, hal))
                if getattr(m, "name", None) == "check":
                    self.check = m
            for mdef, label in zip(mdefs, labels):
                bc = _link_bytecode(mdef, registered, label,
                                    getattr(hal, "memory", None))
                self._bytecode.append(bc)
                registered.append(bc.linked())
                init = bc.exports.get("__init")
                if init is not None:
                    with self.lock:
                        self.run_function(bc.env.functions[init.function], (),
                                  f"{mdef.name}.__init")
        except BaseException:
            self.close()
            raise
        main = self._bytecode[-1]
        self.functions: dict[str, Function] = {}
        for name, e in main.exports.items():
            if name.startswith("__"):
                continue
            fdef = main.mdef.functions[e.function]
            self.functions[name] = Function(
                self, name, e.cconv or fdef.cconv, main.env.functions[e.function],
                (e.attrs or {}).get("iree.abi.declaration"),
                (e.attrs or {}).get("iree.abi.model"))

    def run_function(self, fn, args, name: str):
        """``fn(*args)`` within :attr:`timeout`; the caller holds :attr:`lock`."""
        try:
            if self.timeout is None:
                if self.hal.timeout:
                    self.hal.timeout = None     # (a limit set for earlier calls)
                return fn(*args)
            _install_hook()
            _calls.program = self
            _calls.deadline = time.monotonic() + self.timeout
            self.hal.timeout = self.timeout
            try:
                return fn(*args)
            finally:
                _calls.deadline = None
        except _CALL_FAILURES as exc:
            _raise_call_error(self, exc, name)
            raise

    def function(self, name: str | None = None) -> Function:
        """The public function ``name``; may be omitted when there is one.

        Raises:
            VmError: no such function (the message lists them), or none
                named while several exist.
        """
        if name is None:
            if len(self.functions) != 1:
                raise VmError(f"the module has public functions "
                              f"{printable(', '.join(self.functions)) or '(none)'}; name one",
                              name=self.label, field="--function", value=None)
            return next(iter(self.functions.values()))
        fn = self.functions.get(name.lstrip("@"))
        if fn is None:
            have = ", ".join("@" + f for f in self.functions)
            raise VmError(f"no public function @{printable(name.lstrip('@'), 200)}; "
                          f"the module has {printable(have) or '(none)'}",
                          name=self.label, field="--function", value=name)
        return fn

    def __call__(self, name: str, *inputs) -> list:
        """``program(name, *inputs)`` calls public function ``name``."""
        return self.function(name)(*inputs)

    def take_failures(self) -> list[str]:
        """The ``check`` module's failed expectations since the last call of
        this method."""
        take = getattr(self.check, "take_failures", None)
        return take() if take else []

    def close(self) -> None:
        """Run each module's ``__deinit`` (newest first) and unload the
        executables; idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            for bc in reversed(self._bytecode):
                deinit = bc.exports.get("__deinit")
                if deinit is not None:
                    with self.lock:
                        bc.env.functions[deinit.function]()
        finally:
            self.hal.close()

    def __enter__(self) -> "Program":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<program {self.label} ({self.arch}): "
                f"{', '.join(self.functions) or 'no functions'}>")


def load_program(paths, *, arch: str | None = None, backend: str = "auto",
                 engine: str | None = None, cpu: str | None = None,
                 plugins=None, workers: int | None = None,
                 host_modules: Sequence = (), check: bool = True,
                 fill_byte: int = 0, timeout: float | None = None,
                 trace: list | None = None,
                 memory_limit: int | None = None, record=None,
                 cache_dir: str | None = None,
                 compile_flags: Sequence[str] = ()) -> Program:
    """Read, link and initialize VM modules once; call their functions many
    times.

    Args:
        paths: a ``.vmfb`` path (or bytes, or a
            :class:`~hal_cpu.programs.vm.module_def.ModuleDef` already read, or a
            :class:`hal_cpu.programs.Compiled`), an MLIR file (compiled first
            for ``arch``, default this machine's, with
            :func:`hal_cpu.programs.compile_program`: cached by content under
            ``cache_dir``, ``compile_flags`` added), or a sequence of them
            in registration order; the last one's public functions are the
            program's.
        arch: the architecture to run the executables as (name or alias);
            default: the one the last module's executables name.
        backend: ``auto`` (native when ``arch`` is this machine's),
            ``native`` or ``emulated``.
        engine, cpu: emulation engine and CPU profile (as
            :class:`hal_cpu.Executable`).
        plugins: a :class:`hal_cpu.plugins.PluginManager` resolving the
            executables' imports.
        workers: host threads per dispatch.
        host_modules: Python host modules (:class:`hal_cpu.programs.HostModule`),
            in registration order.
        check: register the built-in ``check`` module.
        fill_byte: initial value of allocated bytes.
        timeout: seconds each call (and each module's ``__init``) may take
            (:attr:`Program.timeout`); None: no limit.
        memory_limit: bytes of buffers the program may hold at once
            (default: half the physical memory,
            :func:`hal_cpu.programs.vm.hal_module.default_memory_limit`); a buffer
            past it is a :class:`VmStatusError` (RESOURCE_EXHAUSTED) naming
            the op, its source line and the size, before anything is
            allocated.
        trace: a list that receives a
            :class:`~hal_cpu.programs.vm.hal_module.DispatchRecord` for every
            dispatch the program runs (``hal-cpu plan`` of a ``.vmfb``), or
            None.
        record: a :class:`hal_cpu.programs.vm.plan.Recording`: the program's command
            buffers and queue transfers are recorded as steps, not run
            (:func:`hal_cpu.programs.vm.plan.plan_program`), or None.

    Returns:
        A :class:`Program` (close it, or use it in a ``with`` block).

    Raises:
        hal_cpu.programs.vm.module_def.ModuleFormatError: a file that is not a valid
            module (names the file and field).
        LinkError: as the module docstring's rules.
        VmStatusError: a module's ``__init`` failed (e.g. no executable
            variant for ``arch``).
        hal_cpu.programs.vm.translate.UnsupportedOpError: an op this runtime does not
            run (names the op and source line).
        hal_cpu.programs.CompileError, hal_cpu.programs.IreeToolError: an MLIR
            file ``iree-compile`` cannot compile, or no supported
            ``iree-compile``.
    """
    from .hal_module import HalModule
    from .module_def import read_module
    if (isinstance(paths, (str, bytes, os.PathLike))
            or (hasattr(paths, "so_files") and hasattr(paths, "vmfb"))
            or (hasattr(paths, "functions") and hasattr(paths, "imports"))):
        paths = [paths]
    mdefs, labels = [], []
    for p in paths:
        if hasattr(p, "so_files") and hasattr(p, "vmfb"):       # a Compiled
            p = p.vmfb
        elif isinstance(p, (str, os.PathLike)) and _is_source(p):
            from ..compiler import compile_program
            p = compile_program(p, arch or arches.host_arch(), cache_dir,
                                extra_flags=list(compile_flags)).vmfb
        if hasattr(p, "functions") and hasattr(p, "imports"):    # a ModuleDef
            mdefs.append(p)
            labels.append(getattr(p, "source", None) or p.name)
            continue
        label = "<bytes>" if isinstance(p, (bytes, bytearray)) else os.fspath(p)
        mdefs.append(read_module(p, name=label))
        labels.append(label)
    if not mdefs:
        raise VmError("no module to load", field="modules", value=0)
    if arch is None:
        for mdef in reversed(mdefs):
            arch = module_arch(mdef)
            if arch is not None:
                break
        if arch is None:
            host = arches.host()
            arch = host.name if host is not None else "x86_64"
    else:
        arch = arches.lookup(arch).name
    hal = HalModule(arch=arch, backend=backend, engine=engine, cpu=cpu,
                    plugins=plugins, workers=workers, fill_byte=fill_byte,
                    memory_limit=memory_limit)
    hal.trace = trace
    hal.record = record
    try:
        return Program(mdefs, labels, hal, host_modules, check=check,
                       timeout=timeout)
    except BaseException:
        hal.close()
        raise


def _is_source(path) -> bool:
    """Whether ``path`` is program source for ``iree-compile`` (MLIR) rather
    than a compiled module (``.vmfb``)."""
    from . import vmfb
    path = os.fspath(path)
    return (os.path.isfile(path) and not str(path).endswith((".vmfb", ".fb"))
            and not vmfb.is_module_file(path))
