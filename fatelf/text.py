"""Text that comes from an input file or from code under test, made safe to
show.

A program's function names, status messages, reflection attributes, a
guest's own output on stderr: any of it may hold escape sequences (clear the
screen, colours, move the cursor) or a newline followed by a line that reads
as this tool's own (``hal-cpu: error: ...``). :func:`printable` turns such
text into one line of data: every control character (C0, DEL, C1), every
line or paragraph separator and every lone surrogate is written as a Python
escape (``\\x1b``, ``\\n``, ``\\u2028``), backslashes are doubled so an
escape in the input cannot pass for one of ours, and long text is cut with
a note of how much was left out. :func:`printable_lines` keeps the line
breaks of a multi-line text (such as a guest's stderr) and labels each line
with where it came from, so none can start at the left margin as a line of
the tool would.
"""

from __future__ import annotations

import unicodedata

#: Characters shown at most by :func:`printable` (a cut text ends with a
#: note of the characters left out).
LIMIT = 400


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _unsafe(ch: str) -> bool:
    # Cc: C0, DEL, C1 controls; Zl/Zp: line and paragraph separators; Cs:
    # lone surrogates (from undecodable bytes); Cf: bidirectional overrides
    # and other invisible format characters that reorder what is shown.
    return ch == "\\" or unicodedata.category(ch) in ("Cc", "Zl", "Zp", "Cs", "Cf")


def _shown(text: str, keep: str, limit: int | None) -> str:
    """``text`` (at most ``limit`` characters of it, then a note of the
    rest) with every unsafe character escaped but those in ``keep``."""
    more = 0
    if limit is not None and len(text) > limit:
        more = len(text) - limit
        text = text[:limit]
    if text.isascii() and text.isprintable() and "\\" not in text:
        # (space to tilde: no character of it is escaped)
        return text + (f"... ({more} more characters)" if more else "")
    out = []
    for ch in text:
        if ch in keep:
            out.append(ch)
        elif 0xDC80 <= ord(ch) <= 0xDCFF:        # an undecodable byte
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif _unsafe(ch):
            out.append(_escape(ch))
        else:
            out.append(ch)
    if more:
        out.append(f"... ({more} more characters)")
    return "".join(out)


def printable(text: str | bytes | None, limit: int | None = LIMIT) -> str:
    """``text`` as one line that shows what it holds and does nothing to a
    terminal.

    Args:
        text: a string, or bytes (decoded as UTF-8, undecodable bytes
            written as ``\\xNN``); None gives ``""``.
        limit: the most characters of ``text`` kept (None: all); a longer
            text is cut and ends with ``... (N more characters)``.

    Returns:
        the text with control, separator, surrogate and format characters
        and backslashes escaped, Python style (``\\x1b``, ``\\n``,
        ``\\u202e``, ``\\\\``).
    """
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    return _shown(text, "", limit)


def printable_lines(text: str | bytes | None, label: str,
                    max_lines: int = 40, limit: int | None = LIMIT) -> str:
    """A multi-line text from a program (a guest's stderr, say) as lines
    each starting with ``label`` (e.g. ``"  guest stderr| "``), each made
    :func:`printable`; at most ``max_lines`` lines, then a line saying how
    many were left out. Returns ``""`` for empty text."""
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    lines = text.splitlines() if text else []
    shown = [label + printable(line, limit) for line in lines[:max_lines]]
    if len(lines) > max_lines:
        shown.append(f"{label}... ({len(lines) - max_lines} more lines)")
    return "\n".join(shown)


def for_terminal(text: str, prog: str | None = None) -> str:
    """A message of the tool itself (possibly several lines: a fault
    report) made safe to print, as the last line of defence of a command
    line's top-level printer: every control character but newline and tab
    (C0, DEL, C1), every line or paragraph separator and every lone
    surrogate is escaped as :func:`printable` does; text already escaped
    is left as it is. With ``prog`` (e.g. ``"hal-cpu"``), a line after the
    first that starts with ``prog:`` is indented with ``"| "``, so that no
    line but the first reads as the tool's own."""
    shown = _shown(str(text), "\n\t\\", None)
    if prog is None or "\n" not in shown:
        return shown
    first, *rest = shown.split("\n")
    mark = prog + ":"
    return "\n".join([first] + ["| " + line if line.lstrip().startswith(mark)
                                else line for line in rest])


def one_line(text: str | None, limit: int | None = LIMIT) -> str:
    """``text`` on one line, as :func:`printable` makes it but with
    backslashes kept: what a report shows of a field that may hold a
    file's or a program's text, escaped already or not (applying it twice
    gives what applying it once gives, for text within ``limit``)."""
    if text is None:
        return ""
    return _shown(str(text), "\\", limit)
