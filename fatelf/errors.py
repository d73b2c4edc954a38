"""The project's error contract, and the errors of the fatelf package.

Every error the project raises derives from :class:`PortableKernelError`
(through :class:`FatElfError`, :class:`elfloader.ElfError` or
:class:`hal_cpu.HalCpuError`) and carries the file (``name``), the field that
was checked (``field``) and the offending value (``value``); its message
reads ``name: field: what is wrong``. Command lines catch this one class.
"""

from __future__ import annotations


class PortableKernelError(Exception):
    """Base class of every error raised by ``fatelf``, ``elfloader`` and
    ``hal_cpu``.

    Args:
        message: what is wrong, in words.
        name: the file (or ``<memory>``, or the object) concerned.
        field: the field or step that was checked, e.g. ``e_machine`` or
            ``record 2.offset``.
        value: the offending value, if any.
    """

    def __init__(self, message: str = "", *, name: str | None = None,
                 field: str | None = None, value=None):
        self.name = name
        self.field = field
        self.value = value
        self.message = message
        super().__init__(": ".join([p for p in (name, field) if p] + [message]))

    def with_name(self, name: str):
        """A copy of this error about ``name`` (used by a caller that knows
        the file when the raiser did not)."""
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        PortableKernelError.__init__(err, self.message, name=name,
                                     field=self.field, value=self.value)
        return err


class FatElfError(PortableKernelError):
    """Base class of every error raised by the fatelf package."""


class FatElfFormatError(FatElfError):
    """A FatELF bundle is malformed (header, record table or payload)."""


class FatElfInputError(FatElfError):
    """An ELF given to a writer (join, replace) is unusable."""


class FatElfSelectError(FatElfError):
    """No record (or more than one) matches a requested target, or an
    architecture name is unknown."""
