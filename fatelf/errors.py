"""Exceptions raised by the fatelf package.

Every error derives from :class:`FatElfError`, so callers can catch that one
class.  Messages always start with the name of the file (or ``<memory>``) and,
where one is involved, the record index, then name the offending field and
its value.
"""

from __future__ import annotations


class FatElfError(Exception):
    """Base class of every error raised by the fatelf package."""


class FatElfFormatError(FatElfError):
    """A FatELF bundle is malformed (header, record table or payload)."""


class FatElfInputError(FatElfError):
    """An ELF given to a writer (join, replace) is unusable."""


class FatElfSelectError(FatElfError):
    """No record (or more than one) matches a requested target, or an
    architecture name is unknown."""
