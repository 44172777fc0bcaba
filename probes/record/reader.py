"""Reading a session record (for export, replay and the end-of-job summary).

``open_record`` checks the header and returns a ``RecordReader`` that streams the lines,
so a record of any length is read in bounded memory. A torn last line (the job was killed
mid-write) is tolerated and noted, and so is a damaged line in the middle (a disk error, an
edit): it is left out and counted (``damaged``), the rest is read. A header that cannot be
read raises ``RecordError`` with one line that a person understands.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO

import msgspec

from .format import (
    KNOWN_TYPES,
    RECORD_FORMAT,
    RECORD_VERSION,
    End,
    Header,
    Line,
    line_decoder,
)

MAX_LINE_BYTES = 64 << 20
# msgspec raises more than DecodeError on a corrupt line: UnicodeDecodeError for a string that is
# not UTF-8, RecursionError for deep nesting.
_UNREADABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


class RecordError(Exception):
    """A record that cannot be read; the message says why, in one line."""


class RecordReader:
    """The lines of one record after its header; iterate once (``lines()``)."""

    def __init__(self, path: Path, file: IO[bytes], header: Header) -> None:
        self.path = path
        self.header = header
        self._file = file
        self.torn = False  # the last line was cut short (the job was killed mid-write)
        self.unknown = 0  # lines of types this version does not know (skipped)
        self.damaged: list[tuple[int, str]] = []  # (line number, why) of lines left out
        self.end: End | None = None
        self.line_count = 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def lines(self) -> Iterator[Line]:
        for number, raw in enumerate(iter(lambda: self._file.readline(MAX_LINE_BYTES), b""), 2):
            self.line_count = number
            complete = raw.endswith(b"\n")
            if not raw.strip():
                continue
            try:
                item = line_decoder.decode(raw)
            except (*_UNREADABLE, msgspec.ValidationError) as exc:
                if not complete and not self._file.read(1):
                    self.torn = True  # the last line, cut short: everything before it counts
                    return
                if self._unknown_type(raw):
                    self.unknown += 1
                    continue
                self.damaged.append((number, _reason(exc)))
                continue
            if isinstance(item, End):
                self.end = item
            yield item

    def damage_note(self) -> str | None:
        """One line about the damaged lines left out (None: there were none)."""
        if not self.damaged:
            return None
        number, why = self.damaged[0]
        more = f" and {len(self.damaged) - 1} more" if len(self.damaged) > 1 else ""
        return (
            f"line {number}{more} of the record {'is' if not more else 'are'} damaged ({why}); "
            "left out, the rest is read"
        )

    @staticmethod
    def _unknown_type(raw: bytes) -> bool:
        try:
            obj = msgspec.json.decode(raw)
        except _UNREADABLE:
            return False
        return (
            isinstance(obj, dict)
            and isinstance(obj.get("type"), str)
            and (obj["type"] not in KNOWN_TYPES)
        )


def resolve(path: Path | str) -> Path:
    """The record file for ``path``, or RecordError saying why there is none."""
    path = Path(path).expanduser()
    if path.is_dir():
        newest = max(path.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, default=None)
        hint = f" (the newest record in it is {newest.name})" if newest else ""
        raise RecordError(f"{path} is a directory, not a record{hint}")
    if not path.exists():
        raise RecordError(f"no record at {path}")
    return path


def open_record(path: Path | str) -> RecordReader:
    """Open a record and check its header; raises RecordError."""
    path = resolve(path)
    try:
        file = open(path, "rb")  # noqa: SIM115 - handed to the reader, which closes it
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        header = _read_header(path, file)
    except BaseException:
        file.close()
        raise
    return RecordReader(path, file, header)


def _read_header(path: Path, file: IO[bytes]) -> Header:
    try:
        first = file.readline(1 << 20)
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not first.strip():
        raise RecordError(f"{path} is empty: nothing was recorded")
    try:
        obj = msgspec.json.decode(first)
    except _UNREADABLE:
        if not first.endswith(b"\n") and first.startswith(b'{"type":"record"'):
            raise RecordError(f"{path} ends inside its header: nothing was recorded") from None
        raise RecordError(f"{path} is not a bsmon record (it does not start with one)") from None
    if (
        not isinstance(obj, dict)
        or obj.get("type") != "record"
        or obj.get("format") != RECORD_FORMAT
    ):
        raise RecordError(f"{path} is not a bsmon record (it does not start with one)")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordError(f"{path}: the record header has no valid version")
    if version > RECORD_VERSION:
        raise RecordError(
            f"{path} is a version {version} record; this bsmon reads versions up to "
            f"{RECORD_VERSION} (upgrade bsmon to read it)"
        )
    try:
        return msgspec.convert(obj, type=Header)
    except msgspec.ValidationError as exc:
        raise RecordError(f"{path}: the record header is corrupt ({exc})") from None


def _reason(exc: Exception) -> str:
    text = str(exc)
    if isinstance(exc, _UNREADABLE):
        return "not valid JSON"
    return text
