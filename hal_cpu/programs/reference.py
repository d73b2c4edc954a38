"""IREE's own runtime as the reference for our dispatches."""

from __future__ import annotations

import os
from typing import Any, Sequence, Union

import numpy as np

from .compiler import INSTALL_HINT, SUPPORTED_VERSION, release_of
from .errors import IreeToolError

__all__ = ["reference_run"]


def _iree_runtime():
    try:
        import iree.runtime as rt
        from iree.runtime import version
    except ImportError as e:
        raise IreeToolError(f"cannot import it ({e}); iree-base-runtime=="
                            f"{SUPPORTED_VERSION} is needed: {INSTALL_HINT}",
                            name="iree.runtime") from None
    found = getattr(version, "VERSION", "")
    if release_of(found) != SUPPORTED_VERSION:
        raise IreeToolError(f"found {found or 'no version'}; iree-base-runtime=="
                            f"{SUPPORTED_VERSION} is needed: {INSTALL_HINT}",
                            name="iree.runtime", field="version", value=found)
    return rt


def reference_run(vmfb: Union[str, os.PathLike], function: str, inputs: Sequence[Any],
                  driver: str = "local-sync",
                  executable_plugins: Sequence[str] = ()) -> list[np.ndarray]:
    """Run ``function`` of ``vmfb`` with IREE's runtime (``iree.runtime``).

    Args:
        vmfb: a module compiled for the host architecture
            (``fatelf.arches.host_arch()``); IREE runs no other.
        function: the public function name (without ``@``).
        inputs: numpy arrays for tensor arguments, Python or numpy scalars.
        driver: IREE HAL driver, ``local-sync`` (one thread) by default.
        executable_plugins: plugin specs registered with IREE's runtime as
            its ``--executable_plugin`` flag does (process-wide: IREE's
            flags are global; plugins given once stay registered for devices
            created later in the process).

    Returns:
        One numpy array per result, as IREE's runtime returns it.

    Raises:
        IreeToolError: ``iree.runtime`` is missing or not
            :data:`~hal_cpu.programs.SUPPORTED_VERSION`.
        Errors of ``iree.runtime`` itself (bad module, unknown function,
        wrong arguments) propagate unchanged.
    """
    rt = _iree_runtime()
    if executable_plugins:
        rt.flags.parse_flags(*[f"--executable_plugin={p}" for p in executable_plugins])
    module = rt.load_vm_flatbuffer_file(str(vmfb), driver=driver)
    args = []
    for v in inputs:
        if isinstance(v, np.ndarray):
            args.append(np.ascontiguousarray(v))
        elif isinstance(v, np.generic):
            args.append(v.item())
        else:
            args.append(v)
    out = module[function](*args)
    if not isinstance(out, (tuple, list)):
        out = (out,)
    return [np.array(o.to_host() if hasattr(o, "to_host") else o) for o in out]
