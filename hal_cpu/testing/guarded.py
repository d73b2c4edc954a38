"""Arrays placed in guest memory between two guard pages, for tests that
must catch every out-of-bounds access of the code under test.

Each array is a :class:`elfloader.backend.guarded.GuardedRange`: a
reservation of its own, built from the :class:`~elfloader.Backend` calls
every backend has (``reserve`` and ``protect``), so it works the same
natively and emulated, placed by the same rule and guarded by the same
canaries as the bindings of a dispatch (that module's docstring says how
the two relate)::

    | guard page | gap below | array | gap above | guard page |
      PROT_NONE    canary            canary        PROT_NONE

* By default the array ends flush against the upper guard page, its start
  aligned only as its dtype needs (``dtype.alignment``): there is no gap
  above it, so even a one-element read past the end touches the guard
  page, whatever the vector length of the code reading it.
* ``align=N`` (a power of two, at most a page) starts the array N-byte
  aligned; its end then lies up to N - 1 bytes before the upper guard page.
  ``padded=True`` is ``align=64``: the start aligned as IREE aligns its
  heap buffers, up to 63 bytes of canary after the end (a read of them goes
  unseen), placed as a dispatch places a binding of that size.
* ``slack`` (of :class:`GuardedArrays`, normally 0) keeps that many bytes of
  canary after every array: :func:`qemu_overread` sets it for x86 code
  that qemu-user reads past its operands (see there).
* Any access to a guard page faults (emulated: the CPU stops with the
  exact address; native: the process gets SIGSEGV). A write into a gap
  (between an array and a guard page) changes its canary (salted by the
  gap's address), which :meth:`GuardedArrays.changed` finds after the
  call.

:class:`GuestArray` is what a test holds: it stands for the array's guest
address wherever an integer is expected (``__index__``), and reads back
as a numpy array (``numpy()``, ``np.asarray``).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from elfloader.backend.guarded import ALIGN, GuardedRange
from elfloader.diagnose import Region

from ..memory import GuestMemory

#: Alignment of a padded array's start, bytes (IREE's heap buffers; the
#: bindings' alignment, :data:`elfloader.backend.guarded.ALIGN`).
ALIGNMENT = ALIGN
#: Byte ``empty()`` arrays are filled with, so that reads of elements the
#: code never wrote stand out.
POISON = 0xCD


#: How reports count elements of common dtypes ("8 floats past the end"):
#: singular and plural.
_UNITS = {"float32": ("float", "floats"), "float64": ("double", "doubles"),
          "float16": ("half", "halves")}


def elements(count: int, dtype) -> str:
    """``8 floats``, ``1 double``, ``3 int16 elements``: ``count`` elements
    of ``dtype`` in words."""
    dtype = np.dtype(dtype)
    kind = dtype.name if dtype.names is None else "struct"
    one, many = _UNITS.get(kind, (f"{kind} element", f"{kind} elements"))
    return f"{count} {one if count == 1 else many}"


def overrun_elements(array: "GuestArray", first: int, last: int) -> str:
    """Where bytes ``first`` to ``last`` (offsets from ``array``'s start,
    all outside it) lie, counted in its elements: ``8 floats past the
    end`` (the elements from the array's end to the one holding ``last``)
    or ``1 float before the start``."""
    size = max(1, array.dtype.itemsize)
    if first >= array.nbytes:
        count = (last - array.nbytes) // size + 1
        return f"{elements(count, array.dtype)} past the end"
    count = -(first // size)          # first < 0: elements from it to 0
    return f"{elements(count, array.dtype)} before the start"


#: x86 instructions whose memory operand qemu-user (7.2) loads in the full
#: width of the destination register: (mnemonic, operand size as capstone
#: spells it, bytes loaded past the operand). A correct load of an array's
#: last element by one of them reaches that far past the array's end.
QEMU_X86_OVERREADS = (
    (re.compile(r"vfn?m(?:add|sub)(?:132|213|231)ss"), "dword ptr", 12),
    (re.compile(r"vfn?m(?:add|sub)(?:132|213|231)sd"), "qword ptr", 8),
    (re.compile(r"v?cvtdq2pd"), "qword ptr", 8),
    (re.compile(r"vcvtdq2pd"), "xmmword ptr", 16),
)


def qemu_overread_of(instruction: str | None) -> int:
    """Bytes qemu-user loads past the memory operand of x86 instruction
    ``instruction`` (its text, e.g. ``vfmadd213ss xmm1, xmm0, dword ptr
    [rdx]``): 0 for the instructions it loads exactly."""
    if not instruction:
        return 0
    mnemonic, _, operands = instruction.strip().partition(" ")
    for pattern, size, extra in QEMU_X86_OVERREADS:
        if pattern.fullmatch(mnemonic) and size + " [" in operands:
            return extra
    return 0


def qemu_overread(backend, modules) -> int:
    """Bytes of canary to keep after every array for code of ``modules``
    run on ``backend``: on the qemu engine for x86, the most any
    instruction in the modules' executable segments loads past its memory
    operand (:data:`QEMU_X86_OVERREADS`), so that their correct loads of an
    array's last element do not reach the guard page, while one element
    further still does (qemu loads it with the same excess); else 0."""
    arch = backend.arch.name
    if arch not in ("x86_64", "x86_32") or backend.kind != "emulated":
        return 0
    describe = getattr(backend, "describe", None)
    if describe is None or not describe().startswith("qemu"):
        return 0
    most = 0
    for module in modules:
        image = getattr(module, "image", None)
        if image is None:
            continue
        for seg in getattr(image, "segments", ()):
            if seg.flags & 1:               # PF_X
                most = max(most, _code_overread(
                    arch == "x86_64",
                    bytes(image.data[seg.offset:seg.offset + seg.filesz])))
    return most


@functools.lru_cache(maxsize=64)
def _code_overread(wide: bool, code: bytes) -> int:
    """The most bytes qemu-user loads past a memory operand of x86 machine
    code ``code`` (64-bit when ``wide``), decoded from its start."""
    import capstone
    md = capstone.Cs(capstone.CS_ARCH_X86,
                     capstone.CS_MODE_64 if wide else capstone.CS_MODE_32)
    md.skipdata = True
    most = 0
    for _, _, mnemonic, operands in md.disasm_lite(code, 0):
        if "ptr [" in operands and ("cvtdq2pd" in mnemonic
                                    or mnemonic.startswith("vf")):
            most = max(most, qemu_overread_of(f"{mnemonic} {operands}"))
    return most


def _padded(padded: bool | None, strict: bool | None) -> bool:
    """``padded`` from the ``padded``/``strict`` pair (``strict`` is its
    older, inverted spelling); both given must agree."""
    if strict is None:
        return bool(padded)
    if padded is not None and bool(padded) == bool(strict):
        raise ValueError(f"padded={padded!r} contradicts strict={strict!r}")
    return not strict


class GuestArray:
    """An array in guest memory, placed by :class:`GuardedArrays`.

    Passing it where an integer is expected (a params struct field, a call
    argument) gives its address; ``numpy()`` or ``np.asarray(a)`` gives a
    copy of its current contents with its dtype and shape.

    Attributes:
        name: how reports name it (``x`` or the params field it was passed
            as, else ``array N``).
        address: guest address of element 0.
        dtype, shape: numpy dtype and shape; nbytes: size in bytes.
        align: alignment of its start, bytes.
        strict: placed flush against the upper guard page (no gap after
            it).
        index: order of placement among the arrays of its owner (from 0).
        range: the :class:`~elfloader.backend.guarded.GuardedRange` it
            occupies.
    """

    def __init__(self, owner: "GuardedArrays", name: str | None, index: int,
                 dtype, shape, guarded: GuardedRange, align: int,
                 explicit_name: bool):
        self._owner = owner
        self.name = name or f"array {index}"
        self.index = index
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.nbytes = guarded.size
        self.range = guarded
        self.address = guarded.address
        self.align = align
        self.explicit_name = explicit_name
        #: reservation start (the lower guard page) and size in bytes
        self.base, self.span = guarded.base, guarded.span
        self.body = guarded.body                        # between the guards

    @property
    def strict(self) -> bool:
        """Whether the array ends flush against its upper guard page."""
        return self.end == self.body[1]

    @property
    def padding(self) -> int:
        """Canary bytes between the array's end and its upper guard page."""
        return self.body[1] - self.end

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def end(self) -> int:
        """First address past the array."""
        return self.address + self.nbytes

    def numpy(self) -> np.ndarray:
        """A copy of the array's current contents in guest memory."""
        return self._owner.memory.numpy(self.address, self.dtype, self.shape)

    def __array__(self, dtype=None, copy=None):
        data = self.numpy()
        return data if dtype is None else data.astype(dtype)

    def __index__(self) -> int:
        return self.address

    def __int__(self) -> int:
        return self.address

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def __repr__(self):
        return (f"<GuestArray {self.name} {self.dtype}{list(self.shape)} at "
                f"{self.address:#x}"
                f"{f', {self.padding} bytes padded' if self.padding else ''}>")


class GuardedArrays:
    """The arrays one test placed in one backend's memory.

    Args:
        memory: the guest memory (its backend reserves and protects).
        padded: default placement of new arrays: False (default) flush
            against the guard page after them, True 64-byte aligned with
            up to 63 bytes of canary after them (see the module docstring);
            None: as ``strict`` says, else False.
        strict: the older spelling: ``strict=False`` is ``padded=True``.
    """

    def __init__(self, memory: GuestMemory, padded: bool | None = False, *,
                 strict: bool | None = None):
        self.memory = memory
        self.backend = memory.backend
        self.page_size = self.backend.page_size
        self.padded = _padded(padded, strict)
        #: canary bytes kept after every new array (see :func:`qemu_overread`)
        self.slack = 0
        self.arrays: list[GuestArray] = []
        self._count = 0

    def alignment(self, dtype, align: int | None = None,
                  padded: bool | None = None, strict: bool | None = None) -> int:
        """Alignment in bytes of the start of a new array of ``dtype``:
        ``align`` when given, else 64 when padded (``padded``, or this
        object's default), else the dtype's.

        Raises:
            ValueError: ``align`` is not a power of two up to a page.
        """
        if align is not None:
            if (isinstance(align, bool) or int(align) != align or align < 1
                    or align & (align - 1) or align > self.page_size):
                raise ValueError(f"align={align!r}: an array's alignment is a "
                                 "power of two from 1 to the page size "
                                 f"({self.page_size})")
            return int(align)
        padded = (self.padded if padded is None and strict is None
                  else _padded(padded, strict))
        return ALIGNMENT if padded else max(1, np.dtype(dtype).alignment)

    def place(self, data: np.ndarray | None, *, dtype=None, shape=(),
              name: str | None = None, align: int | None = None,
              padded: bool | None = None, strict: bool | None = None,
              fill: int | None = None) -> GuestArray:
        """Put an array in guest memory between two guard pages.

        Args:
            data: the values (any array-like; copied, C order), or None for
                an array of ``dtype`` and ``shape`` filled with byte
                ``fill`` (0 when None).
            name: how reports name it.
            align: start the array ``align``-byte aligned (a power of two up
                to a page); its end then lies up to ``align - 1`` bytes
                before the guard page.
            padded: True: 64-byte aligned (``align=64``); False: flush
                against the guard page after it, aligned as its dtype needs
                (default: this object's ``padded``).
            strict: the older spelling: ``strict=True`` is ``padded=False``.

        Raises:
            ValueError: a bad ``align``.
            elfloader.BackendError: the backend cannot map the memory.
        """
        if data is not None:
            data = np.ascontiguousarray(data)
            dtype, shape = data.dtype, data.shape
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        align = self.alignment(dtype, align, padded, strict)
        guarded = GuardedRange(self.backend, nbytes, align, self.slack)
        array = GuestArray(self, name, self._count, dtype, shape, guarded,
                           align, explicit_name=name is not None)
        self._count += 1
        if data is not None and nbytes:
            self.memory.write(array.address, data)
        elif nbytes and fill:
            self.backend.write(array.address, bytes([fill]) * nbytes)
        guarded.write_canaries()
        self.arrays.append(array)
        return array

    def write(self, array: GuestArray, values) -> None:
        """Copy ``values`` (broadcast to the array's shape, cast to its
        dtype) into ``array``."""
        data = np.broadcast_to(np.asarray(values, dtype=array.dtype), array.shape)
        self.memory.write(array.address, np.ascontiguousarray(data))

    def changed(self) -> list[tuple[GuestArray, int, int]]:
        """Canary bytes changed since the arrays were placed (or last
        checked), restored as they are found.

        Returns:
            ``(array, first, last)`` per array with a changed gap: offsets
            in bytes from the array's start of the first and last changed
            byte (negative below the start, ``nbytes`` or more above the
            end), below-the-start gaps first.
        """
        return [(array, first, last) for array in self.arrays
                for first, last in array.range.changed()]

    def near(self, address: int) -> tuple[GuestArray, int] | None:
        """``(array, offset from its start)`` when ``address`` lies in one
        of an array's guard pages or gaps (not in the array itself)."""
        for array in self.arrays:
            if (array.base <= address < array.base + array.span
                    and not array.address <= address < array.end):
                return array, address - array.address
        return None

    def regions(self, names: dict | None = None) -> list[Region]:
        """:class:`~elfloader.diagnose.Region` objects for fault reports:
        each array (named by ``names[array]`` when given, else its name)
        and its two guard pages."""
        out = []
        page = self.page_size
        for array in self.arrays:
            name = (names or {}).get(array, array.name)
            out.append(Region(name, array.address, array.nbytes))
            out.append(Region(f"guard page below {name}", array.base, page,
                              offsets=False, guard=True))
            out.append(Region(f"guard page after {name}", array.body[1], page,
                              offsets=False, guard=True))
        return out

    def snapshot(self) -> list[tuple[int, bytes]]:
        """``(address, bytes)`` of every array's memory between its guard
        pages (array and gaps), to carry a child process's writes back."""
        return [(a.body[0], self.backend.read(a.body[0], a.body[1] - a.body[0]))
                for a in self.arrays]

    def restore(self, snapshot: list[tuple[int, bytes]]) -> None:
        """Write back what :meth:`snapshot` returned."""
        for address, data in snapshot:
            self.backend.write(address, data)

    def release(self, array: GuestArray) -> None:
        """Free one array's memory (its guard pages made read/write again
        first, as a backend may reuse released pages)."""
        if array in self.arrays:
            self.arrays.remove(array)
            array.range.release()

    def close(self) -> None:
        """Free every array."""
        while self.arrays:
            self.release(self.arrays[-1])
