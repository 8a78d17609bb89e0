"""Errors a user can fix: the CLI prints them as one ``error: ...`` line and exits with code 2.

Every class also derives from the built-in exception a Python caller would expect (``ValueError`` for a
bad value, ``FileNotFoundError`` for a missing file...), so library users can keep catching those. An
exception that is *not* a :class:`PatchwordError` (or one of the built-ins the CLI treats the same way,
see :data:`USER_ERRORS`) is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "PatchwordError",
    "ConfigError",
    "DataError",
    "MissingFileError",
    "RunExistsError",
    "ModelNotFoundError",
    "MissingExtraError",
    "USER_ERRORS",
    "report_user_error",
]


class PatchwordError(Exception):
    """Base class of the errors caused by input (config, data, files, models), not by a bug."""


class ConfigError(PatchwordError, ValueError):
    """A config value that cannot work; ``key`` is its dotted path (``model.seps.variant``)."""

    def __init__(self, key: str, message: str) -> None:
        self.key, self.detail = key, message
        super().__init__(f"{key}: {message}" if key else message)


class DataError(PatchwordError, ValueError):
    """A data file that cannot be used; the message names the file and, where it applies, the row."""


class MissingFileError(PatchwordError, FileNotFoundError):
    """A file or directory the user named (or a run needs) does not exist."""


class RunExistsError(PatchwordError, FileExistsError):
    """Refusing to overwrite something the user made (a run directory, an output file)."""


class ModelNotFoundError(PatchwordError, OSError):
    """A pretrained model or tokenizer that is neither a local directory nor in the offline cache."""


class MissingExtraError(PatchwordError, ImportError):
    """An optional dependency is not installed; the message names the pip extra."""


#: What the CLI reports as one line: our own errors, and the built-ins that library code raises for bad
#: input by convention (a ValueError names the argument, a FileNotFoundError the path).
USER_ERRORS: tuple[type[BaseException], ...] = (
    PatchwordError,
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
)


def report_user_error(err: BaseException, verbose: bool = False) -> int:
    """Print a user error as one ``error: ...`` line on stderr (after its traceback when ``verbose``) and
    return the exit code, 2. Every command line entry point reports user errors through this."""
    import sys
    import traceback

    if verbose:
        traceback.print_exception(err)
    print(f"error: {err}", file=sys.stderr)
    return 2
