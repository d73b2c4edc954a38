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

Linking and the crossing of values are the VM's (:mod:`hal_cpu.programs.vm.program`);
:class:`ModuleRegistry` keeps modules checked, in registration order.

A module is a :class:`HostModule` (or any object with ``name``,
``functions`` and ``types``): build one from a dict of callables, or subclass
it and mark methods with :func:`export`. Modules load from a Python file or
an installed entry point (group ``hal_cpu.host_modules``) with
:func:`load_module_spec`: ``path.py[@create_fn][?key=value&...]`` calls
``create_fn(max_version, params)`` (default ``create_module``), which
receives :data:`HOST_MODULE_ABI_VERSION` and may refuse it by raising.
An installed entry point whose name is a module a program imports, when no
module of that name was given, is registered by itself
(:func:`installed_modules`, which linking calls). A host function fails with
an IREE status by raising :class:`StatusError`.

The guide, with a complete example, is ``docs/host-modules.md``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import parse_qsl

from fatelf.text import printable

from .host_api import (
    HOST_MODULE_ABI_VERSION,
    HostCallError,
    HostModule,
    HostModuleError,
    RawTensor,
    StatusCode,
    StatusError,
    export,
)

__all__ = ["HostModule", "export", "ModuleRegistry", "HostModuleError", "HostCallError",
           "RawTensor", "StatusCode", "StatusError", "load_module_spec",
           "installed_modules", "missing_module_hint", "ENTRY_POINT_GROUP",
           "HOST_MODULE_ABI_VERSION"]

#: The entry-point group of installed host modules: an entry point ``NAME =
#: package.module:create_fn`` in it is the module ``--host_module=NAME``
#: loads, and the one registered by itself for a program importing ``NAME``.
ENTRY_POINT_GROUP = "hal_cpu.host_modules"

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
        eps = [ep for ep in entry_points(group=ENTRY_POINT_GROUP)
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


def missing_module_hint(module: str) -> str:
    """How to give a program module ``module`` it imports and nobody
    registered: the end of a link error's message."""
    name = printable(module, 80)
    return (f"give a host module named '{name}': --host_module={name} (an "
            f"installed entry point of group {ENTRY_POINT_GROUP}) or "
            "--module=FILE.py (a Python file whose create_module() returns it); "
            "from Python, load_program(host_modules=[...])")


def installed_modules(mdefs: Sequence[Any], given: Sequence[str] = ()) -> list:
    """The installed host modules (entry points of
    :data:`ENTRY_POINT_GROUP`) that programs ``mdefs`` import and nobody
    gave: for each module name the modules' imports and dependencies name,
    other than ``hal``, the names in ``given`` and the modules ``mdefs``
    themselves define, the entry point of that name, created with no
    parameters (:func:`load_module_spec`), in the order the names first
    appear. Names with no entry point are left to linking, whose error then
    says how to give them (:func:`missing_module_hint`). The installed
    distributions are read only when such a name exists.

    Args:
        mdefs: the modules being linked (``ModuleDef`` records: ``name``,
            ``imports`` with ``name``, ``dependencies`` with ``name``).
        given: names of the modules registered already.

    Raises:
        HostModuleError: an entry point of a needed name that fails to
            load or to create its module (naming it).
    """
    covered = {"hal", *given, *(getattr(m, "name", None) for m in mdefs)}
    wanted: list[str] = []
    for mdef in mdefs:
        names = [imp.name.partition(".")[0] for imp in getattr(mdef, "imports", ())]
        names += [dep.name for dep in getattr(mdef, "dependencies", ())]
        for name in names:
            if name and name not in covered and name not in wanted:
                wanted.append(name)
    if not wanted:
        return []
    from importlib.metadata import entry_points
    installed = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return [load_module_spec(name) for name in wanted if name in installed]


class ModuleRegistry:
    """The host modules a program's imports resolve against.

    Args:
        modules: modules in registration order (later ones win).
        check: register the built-in ``check`` module first (it is the
            oldest registration, so a module named ``check`` given here
            replaces it).
    """

    def __init__(self, modules: Sequence[Any] = (), check: bool = True):
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
