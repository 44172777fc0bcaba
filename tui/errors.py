"""The error type of the command line: printed as one line, with an exit code."""

from __future__ import annotations

EXIT_USAGE = 2


class CliError(Exception):
    """An error for the user: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
