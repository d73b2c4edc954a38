"""A package's public names, imported on first use (PEP 562).

A package's ``__init__`` lists which of its modules defines each public
name; the module is imported when the name is first read (and the value kept
on the package), so ``import hal_cpu`` or ``import fatelf`` costs neither
numpy nor the architecture tables until something needs them.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any, Callable, Iterable, Mapping


def lazy_attributes(package: str, exports: Mapping[str, Iterable[str]], *,
                    submodules: Iterable[str] | None = None,
                    aliases: Mapping[str, str] | None = None,
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package's ``__init__``.

    Args:
        package: the package's ``__name__``.
        exports: module name (relative to the package) -> the public names
            it defines.
        submodules: the submodules readable as attributes
            (``package.module``); ``None``: any submodule that exists.
        aliases: attribute -> submodule it names (e.g. ``arch_mod`` -> ``arch``
            where a function's ``arch`` argument hides the module).

    Returns:
        ``(__getattr__, __dir__)``; ``__getattr__`` raises AttributeError
        for a name that is neither exported nor a submodule.
    """
    where = {name: module for module, names in exports.items() for name in names}
    allowed = None if submodules is None else frozenset(submodules)
    renamed = dict(aliases or {})

    def __getattr__(name: str) -> Any:
        if name in renamed:
            return importlib.import_module(f"{package}.{renamed[name]}")
        module = where.get(name)
        if module is not None:
            value = getattr(importlib.import_module(f"{package}.{module}"), name)
            setattr(sys.modules[package], name, value)
            return value
        if not name.startswith("__") and (allowed is None or name in allowed):
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        mod = sys.modules[package]
        listed = allowed if allowed is not None else {
            info.name for info in pkgutil.iter_modules(mod.__path__)}
        return sorted(set(vars(mod)) | set(where) | set(listed) | set(renamed))

    return __getattr__, __dir__
