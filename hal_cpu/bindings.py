"""Bindings of a dispatch: host arrays to the pointers and lengths the
kernel reads.

A binding is a C-contiguous numpy array or a buffer. Natively an aligned
writable array is used where it is (its own address); any other binding is
copied into 64-byte aligned backend memory (and back when writable) by the
backend's :meth:`~elfloader.Backend.map_array`, whose finisher copies back
and, under emulation, checks the canary bytes after the copy. Bindings
that overlap in host memory (views of one buffer) are mapped as one range,
so the kernel sees them overlap as they do on the host and no copy-back
overwrites another binding's results.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any, Callable, Sequence

import numpy as np

import elfloader
from elfloader import Backend

from .arrays import BINDING_ALIGNMENT, COPY_WARN_BYTES, AlignmentCopyWarning
from .errors import DispatchError

#: What undoes one mapping: copies back and frees a copy (None: nothing).
Finisher = Callable[[], None]


def as_binding(value: Any, index: int) -> np.ndarray:
    """``value`` as the array binding ``index`` maps: a C-contiguous numpy
    array as it is, a buffer as its bytes.

    Raises:
        DispatchError: a non-contiguous array, or neither array nor
            buffer."""
    if type(value) is np.ndarray and value.flags.c_contiguous:
        return value
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise DispatchError("binding arrays must be C-contiguous",
                                field=f"bindings[{index}]", value=value.shape)
        return value
    try:
        return np.frombuffer(value, dtype=np.uint8)
    except (TypeError, ValueError):
        raise DispatchError(f"{type(value).__name__} is neither a numpy array "
                            "nor a buffer", field=f"bindings[{index}]",
                            value=type(value).__name__) from None


def shared_ranges(arrays: Sequence[np.ndarray]
                  ) -> tuple[dict[int, tuple[int, int]],
                             list[tuple[int, int, bool]]] | None:
    """Bindings whose memory overlaps another binding's.

    Returns None when no two arrays can share memory (the common case,
    decided from their ``base`` objects: views of one numpy array or one
    buffer object), else ``(members, groups)``: ``groups`` lists the
    ``(start address, size, writable)`` host range of each set of
    overlapping arrays, ``members`` maps the index of every array in such a
    set to ``(group index, byte offset of the array within the range)``."""
    # Two views of one base, or a view and the array it was taken from,
    # repeat an id among the arrays and their bases.
    keys = [id(a) for a in arrays]
    keys += [id(b) for b in [a.base for a in arrays] if b is not None]
    if len(set(keys)) == len(keys):
        return None
    spans = sorted((a.__array_interface__["data"][0], a.nbytes, i)
                   for i, a in enumerate(arrays) if a.nbytes)
    merged: list[list[Any]] = []      # [start, end, [(index, start)...]]
    for start, size, i in spans:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], start + size)
            merged[-1][2].append((i, start))
        else:
            merged.append([start, start + size, [(i, start)]])
    found: dict[int, tuple[int, int]] = {}
    groups: list[tuple[int, int, bool]] = []
    for start, end, members in merged:
        if len(members) < 2:
            continue
        writable = all(arrays[i].flags.writeable for i, _ in members)
        for i, first in members:
            found[i] = (len(groups), first - start)
        groups.append((start, end - start, writable))
    return (found, groups) if found else None


def map_bindings(backend: Backend, bindings: Sequence, in_place: bool,
                 exp: Any, warned: set[int], path: str
                 ) -> tuple[list[int], list[int], list[Finisher] | None]:
    """Map the bindings of a dispatch of export ``exp`` for the kernel.
    Returns ``(pointers, lengths, finishers)``; run the finishers (unless
    None: no binding was copied) after the dispatch, with :func:`finish`.

    ``in_place`` (native backend): each binding is mapped on its own, so
    an aligned writable array is used where it is; when some were copied
    anyway (:func:`note_copies` warns about a large one), copies of
    overlapping bindings must be one copy, so nothing having run yet, the
    copies go back unchanged and the bindings are mapped again by
    :func:`map_copied`. Otherwise every binding goes through
    :func:`map_copied`. On an error the copies made are undone.

    Raises:
        DispatchError: a binding neither a C-contiguous array nor a
            buffer."""
    finishers: list[Finisher] | None = None
    try:
        if not in_place:
            finishers = []
            pointers, lengths = map_copied(backend, bindings, finishers)
            return pointers, lengths, finishers
        pointers, lengths = [], []
        map_array = backend.map_array
        for i, a in enumerate(bindings):
            if type(a) is not np.ndarray or not a.flags.c_contiguous:
                a = as_binding(a, i)
            address, fn = map_array(a)
            pointers.append(address)
            lengths.append(a.nbytes)
            if fn is not None:
                if finishers is None:
                    finishers = []
                finishers.append(fn)
        if finishers is not None:
            # (stacklevel: the caller of Executable.dispatch)
            note_copies(bindings, exp.ordinal, exp.label, warned, path, 4)
            if len(pointers) > 1:
                for fn in finishers:
                    fn()
                finishers.clear()
                pointers, lengths = map_copied(backend, bindings, finishers)
        return pointers, lengths, finishers
    except BaseException:
        if finishers:
            _undo(finishers)
        raise


def map_copied(backend: Backend, bindings: Sequence,
               finishers: list[Finisher]) -> tuple[list[int], list[int]]:
    """Map the bindings when (some of) them are copied: overlapping
    bindings (views of one buffer) are mapped as one range. Returns
    (pointers, lengths); each mapping's finisher is appended to
    ``finishers`` as it is made."""
    arrays = [as_binding(b, i) for i, b in enumerate(bindings)]
    shared = shared_ranges(arrays) if len(arrays) > 1 else None
    pointers: list[int] = []
    lengths: list[int] = []
    map_array = backend.map_array
    bases = []
    if shared is not None:
        members, groups = shared
        for start, size, writable in groups:
            whole = np.frombuffer(
                memoryview((ctypes.c_uint8 * size).from_address(start)),
                dtype=np.uint8)
            whole.flags.writeable = writable
            address, finish = map_array(whole)
            bases.append(address)
            if finish is not None:
                finishers.append(finish)
    for i, a in enumerate(arrays):
        if shared is not None and i in shared[0]:
            group, offset = shared[0][i]
            pointers.append(bases[group] + offset)
            lengths.append(a.nbytes)
            continue
        address, finish = map_array(a)
        pointers.append(address)
        lengths.append(a.nbytes)
        if finish is not None:
            finishers.append(finish)
    return pointers, lengths


def note_copies(bindings: Sequence, ordinal: int, label: str,
                warned: set[int], path: str, stacklevel: int) -> None:
    """Warn (once per export: ``warned`` holds the ordinals warned about)
    when a binding over :data:`hal_cpu.arrays.COPY_WARN_BYTES` of the
    export ``ordinal`` (named ``label``) is copied because it is not
    64-byte aligned; ``stacklevel`` as for :func:`warnings.warn` here (1:
    this function)."""
    if ordinal in warned:
        return
    for i, a in enumerate(bindings):
        a = as_binding(a, i)
        address = a.__array_interface__["data"][0]
        if a.nbytes > COPY_WARN_BYTES and address % BINDING_ALIGNMENT:
            warned.add(ordinal)
            warnings.warn(AlignmentCopyWarning(
                f"{path}: binding {i} of export {label} "
                f"({a.nbytes} bytes at an address {address % 64} bytes "
                "past a 64-byte boundary) is copied in and out on every "
                "dispatch; make it with hal_cpu.empty/zeros/full/asarray "
                "to have it used in place"), stacklevel=stacklevel)
            return


def finish(finishers: list[Finisher], ran: bool, exe: Any, exp: Any,
           pointers: list[int] | None, lengths: list[int] | None) -> None:
    """Run every binding's finisher (copy-back, canary check); after a
    dispatch that ran (``pointers`` and ``lengths`` then say where each
    binding was), a canary found overwritten raises (the error names the
    executable ``exe``, its export ``exp`` and the binding).

    Raises:
        BindingOverrunError: the kernel wrote past a binding's end."""
    overrun = None
    for fn in finishers:
        try:
            fn()
        except elfloader.GuardError as exc:
            overrun = overrun or exc
    if (overrun is not None and ran and pointers is not None
            and lengths is not None):
        from .faults import binding_overrun
        raise binding_overrun(overrun, exe, exp, pointers, lengths) from None


def _undo(finishers: list[Finisher]) -> None:
    """Run the finishers of mappings made for a dispatch that will not run
    (an overwritten canary means nothing then)."""
    for fn in finishers:
        try:
            fn()
        except elfloader.GuardError:
            pass
