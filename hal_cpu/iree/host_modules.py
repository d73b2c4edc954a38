"""Host modules: functions of the host application that a program imports
by name, as IREE's custom-module samples define them.

A program declares ``func.func private @custom.string.print(!custom.string)``
and calls it; the call resolves to function ``string.print`` of a module
named ``custom`` registered with the runner. Rules (those of IREE's VM
context):

* modules are searched newest registration first;
* an import with ``vm.fallback = @f`` is optional: when no module provides
  it, the program's own ``@f`` runs instead;
* any other import that no module provides is an error before anything runs
  (:class:`HostModuleError` naming it);
* ``vm.signature`` fixes the types the module sees (e.g. ``i64`` for an
  ``index``).

Values cross as IREE's types: integers as Python ints (signed), floats as
Python floats, ``!util.buffer`` as :class:`bytes`, ``!hal.buffer_view`` as a
numpy array (a :class:`RawTensor` for element types numpy lacks, e.g.
``i4``), and a module's own reference types (``!custom.string``) as the
Python objects it returns, checked against the class the module declares for
that type name in :attr:`HostModule.types`. A function returns None, one
value, or a tuple of values.

A module is a :class:`HostModule` (or any object with ``name``,
``functions`` and ``types``): build one from a dict of callables, or subclass
it and mark methods with :func:`export`. Modules load from a Python file or
an installed entry point (group ``hal_cpu.host_modules``) with
:func:`load_module_spec`: ``path.py[@create_fn][?key=value&...]`` calls
``create_fn(max_version, params)`` (default ``create_module``), which
receives :data:`HOST_MODULE_ABI_VERSION` and may refuse it by raising.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import parse_qsl

import numpy as np

from fatelf.text import printable

from .errors import EvaluationError
from .host_api import (
    HOST_MODULE_ABI_VERSION,
    HostCallError,
    HostModule,
    HostModuleError,
    RawTensor,
    export,
)
from .scalars import element_dtype, float_dtype, int_width, round_float, signed, wrap

__all__ = ["HostModule", "export", "ModuleRegistry", "HostModuleError", "HostCallError",
           "RawTensor", "load_module_spec", "HOST_MODULE_ABI_VERSION"]

def _module_ok(module, spec: str) -> None:
    """Check everything linking will read of ``module`` (so that a module
    refused here never reaches a registry).

    Raises:
        HostModuleError: no ``name`` string, ``functions`` not a mapping of
            names to callables, ``types`` not a mapping of names to classes,
            a ``version`` that is not an integer; naming ``spec`` and the
            value.
    """
    from collections.abc import Mapping
    for attr in ("name", "functions"):
        if not hasattr(module, attr):
            raise HostModuleError(f"{spec}: the creation function returned {module!r:.80}, "
                                  f"which has no '{attr}'", name=spec, field="module")
    name = module.name
    if not isinstance(name, str) or not name:
        raise HostModuleError(f"the module's name is {name!r:.60}, not a module name",
                              name=spec, field="name", value=repr(name)[:80])
    functions = module.functions
    if not isinstance(functions, Mapping):
        raise HostModuleError(f"module '{printable(name, 200)}': functions is a "
                              f"{type(functions).__name__} ({functions!r:.60}), not a "
                              "mapping of function names to callables", name=spec,
                              field="functions", value=type(functions).__name__)
    for fname, fn in functions.items():
        if not isinstance(fname, str) or not callable(fn):
            raise HostModuleError(f"module '{printable(name, 200)}': function {fname!r:.60} is "
                                  f"{fn!r:.60}, not callable", name=spec,
                                  field="functions", value=repr(fname)[:80])
    types = getattr(module, "types", None) or {}
    if not isinstance(types, Mapping) or not all(
            isinstance(k, str) and isinstance(v, type) for k, v in types.items()):
        raise HostModuleError(f"module '{printable(name, 200)}': types is "
                              f"{printable(repr(types), 80)}, not a mapping "
                              "of type names to classes", name=spec, field="types",
                              value=type(types).__name__)
    version = getattr(module, "version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise HostModuleError(f"module '{printable(name, 200)}': version is "
                              f"{version!r:.60}, not an integer", name=spec, field="version",
                              value=repr(version)[:80])


def load_module_spec(spec: str, max_version: int = HOST_MODULE_ABI_VERSION):
    """Load a module from ``path.py[@create_fn][?key=value&...]`` or
    ``entry_point_name[?...]`` (group ``hal_cpu.host_modules``).

    The file is imported as a fresh Python module; ``create_fn`` (default
    ``create_module``) is called as ``create_fn(max_version, params)``,
    ``params`` being the ``key=value`` pairs as a dict of strings.

    Raises:
        HostModuleError: no such file, entry point or function; the creation
            function raised (e.g. refusing ``max_version``) or returned
            something that is not a module.
    """
    text, _, query = spec.partition("?")
    params = dict(parse_qsl(query, keep_blank_values=True))
    path_text, _, fn_name = text.partition("@")
    fn_name = fn_name or "create_module"
    path = Path(path_text)
    if path.suffix == ".py" or "/" in path_text:
        if not path.is_file():
            raise HostModuleError("no such file", name=spec, field="--module",
                                  value=path_text)
        mod_name = f"_hal_cpu_host_module_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise HostModuleError("Python cannot import this file", name=spec,
                                  field="--module", value=path_text)
        pymod = importlib.util.module_from_spec(loader_spec)
        try:
            loader_spec.loader.exec_module(pymod)
        except Exception as e:  # the file's own error, reported as one line
            raise HostModuleError(f"importing it failed: {type(e).__name__}: {printable(str(e))}",
                                  name=spec, field="--module", value=path_text) from None
        create = getattr(pymod, fn_name, None)
    else:
        from importlib.metadata import entry_points
        eps = [ep for ep in entry_points(group="hal_cpu.host_modules")
               if ep.name == path_text]
        if not eps:
            raise HostModuleError("neither a .py file nor an installed entry point of "
                                  "group hal_cpu.host_modules", name=spec,
                                  field="--module", value=path_text)
        create = eps[0].load()
    if not callable(create):
        raise HostModuleError(f"has no creation function {fn_name}()", name=spec,
                              field="--module", value=fn_name)
    try:
        module = create(max_version, params)
    except Exception as e:
        raise HostModuleError(f"{fn_name}() refused to create the module: {printable(str(e))}",
                              name=spec, field="--module", value=max_version) from None
    _module_ok(module, spec)
    return module


def _is_ref_type(ty: str) -> bool:
    return ty.startswith("!") and not ty.startswith(("!hal.", "!util."))


class ModuleRegistry:
    """The host modules a program's imports resolve against.

    Args:
        modules: modules in registration order (later ones win).
        check: register the built-in ``check`` module first (it is the
            oldest registration, so a module named ``check`` given here
            replaces it).
    """

    def __init__(self, modules: Sequence[Any] = (), check: bool = True):
        #: called once, before the first call into a host module (a command
        #: line prints its header there, ahead of what modules print)
        self.before_first_call: Callable[[], None] | None = None
        self.modules: list = []
        if check:
            from .check import CheckModule
            self.modules.append(CheckModule())
        for m in modules:
            self.register(m)

    def register(self, module) -> None:
        """Register a module (it wins over those registered before)."""
        _module_ok(module, repr(module))
        self.modules.append(module)

    def find(self, module: str, function: str):
        """``(module object, callable)`` of the newest module named
        ``module`` that has ``function``, else None."""
        for mod in reversed(self.modules):
            if mod.name == module and function in mod.functions:
                return mod, mod.functions[function]
        return None

    def module(self, name: str):
        """The newest module named ``name``, or None."""
        for mod in reversed(self.modules):
            if mod.name == name:
                return mod
        return None

    def type_class(self, ty: str):
        """The class declared for reference type ``!ty`` (newest first)."""
        name = ty.lstrip("!")
        for mod in reversed(self.modules):
            cls = getattr(mod, "types", {}).get(name)
            if cls is not None:
                return cls
        return None

    # -- linking ---------------------------------------------------------------
    def link(self, program) -> dict[str, Callable]:
        """``import name -> call(machine, args) -> results`` for every import
        of ``program``.

        Raises:
            HostModuleError: a required import no module provides, a fallback
                the program does not define, or a reference type no module
                declares.
        """
        linked = {}
        for imp in program.imports.values():
            found = self.find(imp.module, imp.function)
            if found is not None:
                arg_types, result_types = imp.signature or (imp.arg_types, imp.result_types)
                for ty in (*arg_types, *result_types):
                    if _is_ref_type(ty) and self.type_class(ty) is None:
                        raise HostModuleError(
                            f"import @{printable(imp.name, 200)} uses type "
                            f"{printable(ty, 200)}, which no registered "
                            "module declares", name=imp.where.path,
                            field=f"line {imp.where.line}", value=ty)
                linked[imp.name] = self._host_call(imp.name, found[1], arg_types,
                                                   result_types)
            elif imp.fallback is not None:
                fb = program.functions.get(imp.fallback)
                if fb is None:
                    raise HostModuleError(f"import @{printable(imp.name, 200)} falls back "
                                          f"to @{printable(imp.fallback, 200)}, "
                                          "which the program does not define",
                                          name=imp.where.path, value=imp.fallback)
                linked[imp.name] = _fallback_call(fb)
            else:
                have = ", ".join(sorted({m.name for m in self.modules})) or "none"
                raise HostModuleError(
                    f"the program imports @{printable(imp.name, 200)}, which no "
                    f"registered host module provides (modules: {printable(have)}); "
                    f"register a module named '{printable(imp.module, 200)}' with "
                    f"function '{printable(imp.function, 200)}'",
                    name=imp.where.path, field=f"line {imp.where.line}" if imp.where.line
                    else None, value=imp.name)
        return linked

    def _host_call(self, name: str, fn: Callable, arg_types, result_types) -> Callable:
        # The import's name is the program's text; what the function raises
        # or returns is the module's: all of it shown escaped.
        name = printable(name, 200)

        def call(m, args):
            if self.before_first_call is not None:
                hook, self.before_first_call = self.before_first_call, None
                hook()
            host_args = [to_host(m, self, v, t, f"argument {i} of @{name}")
                         for i, (v, t) in enumerate(zip(args, arg_types))]
            try:
                out = fn(*host_args)
            except EvaluationError:
                raise
            except Exception as e:
                raise HostCallError(f"@{name} failed: {type(e).__name__}: "
                                    f"{printable(str(e))}") from None
            if len(result_types) == 0:
                vals = []
            elif len(result_types) == 1:
                vals = [out]
            else:
                if not isinstance(out, (tuple, list)) or len(out) != len(result_types):
                    raise HostCallError(f"@{name} returned {printable(repr(out), 80)}; "
                                        "it must return "
                                        f"{len(result_types)} values")
                vals = list(out)
            return [from_host(m, self, v, t, f"result {i} of @{name}")
                    for i, (v, t) in enumerate(zip(vals, result_types))]
        return call

    def call_builtin(self, m, module: str, function: str, args: list,
                     types: Sequence[str]) -> list:
        """Call ``module.function`` for an op of the program (the ``check``
        ops), converting as for imports.

        Raises:
            HostModuleError: no registered module provides it.
        """
        found = self.find(module, function)
        if found is None:
            raise HostModuleError(f"no registered host module provides "
                                  f"{printable(module, 200)}.{printable(function, 200)}",
                                  value=f"{module}.{function}")
        return self._host_call(f"{module}.{function}", found[1], list(types), [])(m, args)


def _fallback_call(fb) -> Callable:
    def call(m, args):
        if len(fb.arg_types) not in (0, len(args)):
            raise HostModuleError(f"fallback @{printable(fb.name, 200)} takes {len(fb.arg_types)} "
                                  f"arguments; the import passes {len(args)}")
        return m.run(fb, args[:len(fb.arg_types)])
    return call


# -- crossing values -----------------------------------------------------------

def to_host(m, registry: ModuleRegistry, value, ty: str, what: str):
    """The host module's view of an interpreter value of IR type ``ty``."""
    w = int_width(ty)
    if w is not None:
        return signed(value, w) if w > 1 else int(value)
    if float_dtype(ty) is not None:
        return float(value)
    if ty == "!util.buffer":
        from .device import HostBuffer
        return bytes(value.data) if isinstance(value, HostBuffer) else None
    if ty == "!hal.buffer_view":
        from .device import BufferView
        if not isinstance(value, BufferView):
            raise HostCallError(f"{what} is {printable(repr(value), 80)}, not a buffer view")
        dt = element_dtype(value.element_type)
        data = m.device.read(value.buffer, 0, value.buffer.length, what)
        if dt is None:
            return RawTensor(value.shape, value.element_type, data)
        count = int(np.prod(value.shape, dtype=np.int64))
        return np.frombuffer(data, dt, count).reshape(value.shape).copy()
    if _is_ref_type(ty):
        cls = registry.type_class(ty)
        if value is not None and cls is not None and not isinstance(value, cls):
            raise HostCallError(f"{what} is a {type(value).__name__}, not a {ty}")
    return value


def from_host(m, registry: ModuleRegistry, value, ty: str, what: str):
    """The interpreter value of a host module's result of IR type ``ty``.

    Raises:
        HostCallError: the value is not of that type.
    """
    w = int_width(ty)
    try:
        if w is not None:
            return wrap(int(value), w)
        if float_dtype(ty) is not None:
            return round_float(float(value), ty)
    except (TypeError, ValueError):
        raise HostCallError(f"{what} is {printable(repr(value), 80)}, not a {ty}") from None
    if ty == "!util.buffer":
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise HostCallError(f"{what} is {printable(repr(value), 80)}, not bytes")
        from .device import HostBuffer
        return HostBuffer(np.frombuffer(bytes(value), np.uint8).copy())
    if ty == "!hal.buffer_view":
        from ..buffers import dtype_name
        from .device import BufferView
        arr = np.asarray(value)
        try:
            name = dtype_name(arr.dtype)
        except Exception:
            raise HostCallError(f"{what} has dtype {arr.dtype}, which has no IREE "
                                "element type") from None
        data = np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8).copy()
        buf = m.device.constant(data, what.replace(" ", "_"))
        return BufferView(buf, tuple(int(d) for d in arr.shape), name)
    if _is_ref_type(ty):
        cls = registry.type_class(ty)
        if value is not None and cls is not None and not isinstance(value, cls):
            raise HostCallError(f"{what} is a {type(value).__name__}, not a {ty} "
                                f"({cls.__name__})")
    return value

