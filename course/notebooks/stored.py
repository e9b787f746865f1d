"""Read a notebook file without its stored outputs, in one streaming pass.

nbgrader clears every output before it runs a submission (``ClearOutput``), so
the outputs a student saved (a long printout, a large figure) are never graded.
They are also most of a large notebook's bytes. :func:`strip_outputs` copies
the file's JSON text, chunk by chunk, into a new one in which the value of
every cell's ``outputs`` key is ``[]``; nothing else changes (sources,
metadata, attachments and ids stay byte for byte). The file is never held in
memory: what is kept is at most ``limit_bytes`` plus one chunk, and what is
dropped passes through one chunk at a time.

This is a scanner, not a parser: it tracks only the nesting of objects and
arrays, object keys, and where strings end. A file that is not valid JSON
comes out invalid too, and the JSON parser that reads the result says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["CHUNK_BYTES", "KeptTooLarge", "Stripped", "strip_outputs"]

CHUNK_BYTES = 1 << 20
_STRUCTURE = re.compile(rb'["{}\[\]:,]')
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
# What may end a dropped value: a bracket, and at the value's top level a comma. Searched
# with bytes.find (memchr), one character at a time: re's character classes are ten times
# slower on the megabytes of a stored output.
_INNER, _TOP = b"{}[]", b"{}[],"


def _unescaped(buf: bytearray) -> bytearray:
    """``buf`` with every escaped backslash and quote replaced by ``__``: the quotes left
    are the ones that open or close strings (JSON has backslashes only in strings).

    Escapes are paired from the start, so ``buf`` must start outside a string or at the
    start of an escape; the scanner only ever cuts its buffer there.
    """
    return buf.replace(b"\\\\", b"__").replace(b'\\"', b"__")


class KeptTooLarge(ValueError):
    """What is kept (everything but the outputs) passed the limit."""


@dataclass(frozen=True)
class Stripped:
    """A notebook's JSON text with every cell's outputs replaced by ``[]``."""

    data: bytes
    outputs_dropped: int  # cells whose stored outputs were not empty
    dropped_bytes: int  # bytes of the file left out


@dataclass
class _Frame:
    """One open object or array: the key being read, and whether it is a list of cells."""

    is_object: bool
    key: str | None = None
    expecting_key: bool = False
    holds_cells: bool = False


def _notebook_level(stack: list[_Frame]) -> bool:
    """Whether the innermost open object is the notebook (nbformat 4) or one of its
    worksheets (nbformat 3): where a ``cells`` key holds the notebook's cells."""
    if len(stack) == 1:
        return stack[0].is_object
    return len(stack) == 3 and stack[0].key == "worksheets" and stack[2].is_object


class _Scanner:
    def __init__(self, stream: BinaryIO, limit_bytes: int) -> None:
        self.stream = stream
        self.limit_bytes = limit_bytes
        self.buf = bytearray()
        self.unescaped = bytearray()
        self.fills = 0
        self.pos = 0
        self.eof = False
        self.kept = bytearray()
        self.outputs_dropped = 0
        self.dropped_bytes = 0

    def fill(self, boundary: int | None = None) -> bool:
        """Drop what was consumed, read one more chunk; False at the end of the file.

        ``boundary``: an offset at the start of an escape, before which ``unescaped`` stays
        right (a long kept string is then not unescaped again at every chunk).
        """
        del self.buf[: self.pos]
        if boundary is None:
            self.unescaped = bytearray()
            boundary = 0
        else:
            del self.unescaped[: self.pos]
            boundary -= self.pos
            del self.unescaped[boundary:]
        self.pos = 0
        chunk = self.stream.read(CHUNK_BYTES)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        self.fills += 1
        self.unescaped += _unescaped(self.buf[boundary:])
        return True

    def keep(self, data: bytes | bytearray) -> None:
        # A copy (a slice of the buffer), never a memoryview of it: a view that outlived this
        # call would forbid resizing the buffer, and a sampling profiler (a Dask worker runs
        # one) can keep a finished call's frame, and so its arguments, alive a while.
        self.kept += data
        if len(self.kept) > self.limit_bytes:
            raise KeptTooLarge(f"more than {self.limit_bytes} bytes without outputs")

    def string_end(self, keeping: bool) -> int | None:
        """Offset just past the closing quote of the string whose opening quote was just
        consumed (``self.pos`` is its first byte); None at the end of the file. A kept
        string stays in the buffer until it ends; a dropped one is consumed as it goes."""
        offset = self.pos
        while True:
            quote = self.unescaped.find(b'"', offset)
            if quote >= 0:
                return quote + 1
            # Leave a trailing run of backslashes for the next chunk: it may escape a quote.
            tail = len(self.buf)
            while tail > offset and self.buf[tail - 1] == _BACKSLASH:
                tail -= 1
            if keeping and tail - self.pos > self.limit_bytes:
                raise KeptTooLarge(f"a string of more than {self.limit_bytes} bytes")
            if not keeping:
                self.dropped_bytes += tail - self.pos
                self.pos = tail
            shift = self.pos
            if not self.fill(boundary=tail):
                return None
            offset = tail - shift

    def next_break(self, chars: bytes, cache: dict[int, int]) -> int:
        """Offset of the first of ``chars`` at or after ``self.pos``, -1 if none in the
        buffer. ``cache`` holds each character's last offset found (cleared on a refill)."""
        first = -1
        for char in chars:
            at = cache.get(char, -2)
            if at != -1 and at < self.pos:
                at = self.unescaped.find(char, self.pos)
                cache[char] = at
            if at >= 0 and (first < 0 or at < first):
                first = at
        return first

    def skip_value(self) -> None:
        """Consume one JSON value (the outputs), keeping nothing of it.

        Brackets are found with ``find``; one is inside a string when an odd number of
        quotes lies between it and the last point known to be outside any string.
        """
        depth, nonempty = 0, False
        cache: dict[int, int] = {}
        while True:
            at = self.next_break(_INNER if depth else _TOP, cache)
            limit = at if at >= 0 else len(self.buf)
            quotes = self.unescaped.count(b'"', self.pos, limit)
            nonempty = nonempty or (quotes > 0 and depth > 0)
            if quotes % 2:  # ``limit`` lies in a string: go to that string's end
                opening = self.unescaped.rfind(b'"', self.pos, limit)
                self.dropped_bytes += opening + 1 - self.pos
                self.pos = opening + 1
                fills = self.fills
                end = self.string_end(keeping=False)
                if self.fills != fills:
                    cache.clear()
                if end is None:
                    return
                self.dropped_bytes += end - self.pos
                self.pos = end
                continue
            if at < 0:
                self.dropped_bytes += len(self.buf) - self.pos
                self.pos = len(self.buf)
                cache.clear()
                if not self.fill():
                    return
                continue
            char = self.buf[at]
            if depth == 0 and char in b",}]":
                self.dropped_bytes += at - self.pos
                self.pos = at
                break
            self.dropped_bytes += at + 1 - self.pos
            self.pos = at + 1
            if char in b"{[":
                depth += 1
                nonempty = nonempty or char == ord("{")
            else:
                depth -= 1
                if depth == 0:
                    break
        self.outputs_dropped += nonempty

    def run(self) -> Stripped:
        stack: list[_Frame] = []
        drop_next = False
        self.fill()
        while True:
            found = _STRUCTURE.search(self.buf, self.pos)
            if found is None:  # numbers, literals and spaces, up to the chunk's end
                self.keep(self.buf[self.pos :])
                self.pos = len(self.buf)
                if not self.fill():
                    break
                continue
            at, char = found.start(), self.buf[found.start()]
            self.keep(self.buf[self.pos : at + 1])
            self.pos = at + 1
            frame = stack[-1] if stack else None
            if char == _QUOTE:
                end = self.string_end(keeping=True)
                if end is None:
                    self.keep(self.buf[self.pos :])
                    break
                text = self.buf[self.pos : end]
                self.keep(text)
                self.pos = end
                if frame is not None and frame.is_object and frame.expecting_key:
                    frame.key = json.loads(b'"' + bytes(text))
                    frame.expecting_key = False
                    parent = stack[-2] if len(stack) > 1 else None
                    drop_next = frame.key == "outputs" and bool(parent and parent.holds_cells)
            elif char == ord(":"):
                if drop_next:
                    drop_next = False
                    self.skip_value()
                    self.keep(b"[]")
            elif char == ord(","):
                if frame is not None and frame.is_object:
                    frame.expecting_key = True
            elif char == ord("{"):
                stack.append(_Frame(is_object=True, expecting_key=True))
            elif char == ord("["):
                cells = frame is not None and frame.key == "cells" and _notebook_level(stack)
                stack.append(_Frame(is_object=False, holds_cells=cells))
            elif stack:  # a closing bracket
                stack.pop()
        return Stripped(bytes(self.kept), self.outputs_dropped, self.dropped_bytes)


def strip_outputs(stream: BinaryIO, limit_bytes: int) -> Stripped:
    """The notebook text read from ``stream`` with each cell's ``outputs`` set to ``[]``.

    Raises :class:`KeptTooLarge` as soon as the text kept passes ``limit_bytes``.
    """
    return _Scanner(stream, limit_bytes).run()
