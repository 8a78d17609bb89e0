"""Writing files a user keeps, so that a kill or a full disk at any moment loses nothing already written.

* :func:`atomic_write` (and ``_bytes`` / ``_text``): through a temporary file beside the target, flushed to
  disk, then renamed into place; a reader (or a crash) sees the old content or the new, never a mix, and a
  failure leaves the old file as it was.
* :func:`append_line`: one JSONL record appended and flushed to disk; a failure cuts the file back to what
  it held, so the next append never continues a torn line.
* :func:`remove_stale_temps`: a kill (``kill -9``, the OOM killer) runs no cleanup, so the temporary file of
  a write it cut short stays; the command that owns the directory removes them when it starts again.
* :func:`replace_directory`: a filled folder put in place of a non-empty one so that a kill leaves the old
  set or the new one, never a mix (:func:`recover_directory` finishes what a kill between two renames left).
* Each of them then syncs the directory (:func:`fsync_directory`), so that the new name, not only the new
  bytes, survives a power loss.
* :func:`check_output_file` and :func:`check_output_dir`: before any work, the file or the directory a
  command will write, refused (naming the flag or config key) where it cannot go: a file in the place of a
  directory, or of one of its parents; a folder that takes no files (:func:`probe_writable`).

An operating-system error always names the file (``OSError.filename``), so the command line reports it as
one line (:func:`patchword.errors.run_command`).

Over 400 lines: the writers and the clean-up after a kill share the names of temporary files and staging
folders (:func:`is_temp_of` and :func:`staging_dirs` must match what :func:`atomic_write` and
:func:`staging_dir` create), so they stay in one module.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Collection
from typing import IO

__all__ = [
    "staging_dir",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "fsync_directory",
    "append_line",
    "write_all",
    "keep_jsonl_records",
    "repair_jsonl",
    "is_temp_of",
    "only_entries",
    "remove_stale_temps",
    "replace_directory",
    "recover_directory",
    "file_sha256",
    "probe_writable",
    "check_output_file",
    "check_output_dir",
    "staging_dirs",
]

_logger = logging.getLogger(__name__)


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it: done once, at import, before any thread
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def staging_dir(final: str | os.PathLike[str], label: str) -> str:
    """A new empty directory beside ``final`` (``.{name}.{label}-XXXX``) to fill and then rename to it.

    ``mkdtemp`` makes it private (0700); the directory a user keeps gets the permissions ``mkdir`` gives
    (0777 less the umask), like a run directory."""
    final = os.fspath(final)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(final) or ".", prefix=f".{os.path.basename(final)}.{label}-")
    os.chmod(tmp, 0o777 & ~_UMASK)
    return tmp


def staging_dirs(final: str | os.PathLike[str], label: str) -> list[str]:
    """The :func:`staging_dir` folders of ``final`` and ``label`` (exactly its names: ``mkdtemp`` adds 8 of
    ``[a-z0-9_]``, so the stage of an output named ``<final>.<label>-x`` is not one), sorted; outside a
    write, those a killed write left (each as large as what it was filling)."""
    final = os.fspath(final)
    folder = os.path.dirname(final) or "."
    name = re.compile(re.escape(f".{os.path.basename(final)}.{label}-") + r"[a-z0-9_]{8}")
    try:
        entries = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    paths = (os.path.join(folder, entry) for entry in entries if name.fullmatch(entry))
    return [path for path in paths if os.path.isdir(path) and not os.path.islink(path)]


def fsync_directory(folder: str | os.PathLike[str]) -> None:
    """Flush ``folder``'s entries to disk after a rename or a new file in it.

    The file's own ``fsync`` makes its bytes durable, not its name: after a power loss (not a kill: the
    kernel keeps a dead process's renames) the directory could still list the old file, or none. Skipped
    where a directory cannot be opened or synced at all (Windows; file systems that refuse it with
    EINVAL). Any other failure (EIO, ENOSPC) is a warning, not an error: the rename is done and every
    process sees the new file, so the command's result stands; only its survival of a power loss is
    unconfirmed (an error would tell the user to rerun a job whose output is complete, which refuses).
    """
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _NO_DIRECTORY_SYNC:
            _logger.warning(
                "%s: the directory could not be synced to disk (%s): its new entries may not survive a "
                "power loss",
                os.fspath(folder),
                err.strerror or err,
            )
    finally:
        os.close(fd)


#: What a file system that cannot sync a directory answers (not a failure of the disk).
_NO_DIRECTORY_SYNC = {errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES, errno.EPERM}


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> None:
    """Create or replace ``path`` with what ``write(file)`` writes into an open binary file."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            recorder = _WriteErrors(fh)
            try:
                write(recorder)
            except Exception as err:
                # a writer that catches the failure of its own write and raises something else (torch's
                # zip writer: "RuntimeError: [enforce fail at inline_container.cc] unexpected pos") still
                # failed because the disk did: report the operating system's error, naming the file
                if recorder.error is None or isinstance(err, OSError):
                    raise
                raise _naming(recorder.error, path) from err
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates the file private (0600); a file the user keeps gets the usual permissions.
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
        fsync_directory(folder)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:
            raise _naming(err, path) from err
        raise


class _WriteErrors:
    """A binary file that remembers the first ``OSError`` its ``write`` raised (and raises it as before)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh, self.error = fh, None

    def write(self, data) -> int:
        try:
            return self._fh.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str):  # flush, tell, seek, fileno...: the file's own
        return getattr(self._fh, name)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


def _naming(err: OSError, path: str) -> OSError:
    """``err`` with the file it happened to (a failed ``write`` or ``fsync`` only knows the descriptor)."""
    return OSError(err.errno, err.strerror or str(err), path)


def write_all(fd: int, data: bytes | memoryview, path: str | os.PathLike[str]) -> None:
    """``os.write`` to descriptor ``fd`` until every byte of ``data`` is written. A failure is an ``OSError``
    naming ``path``; a write that takes nothing without an error is a full disk (``ENOSPC``), not a loop."""
    import errno

    view = memoryview(data).cast("B")
    while view:
        try:
            written = os.write(fd, view)
        except OSError as err:
            if err.filename is None:
                raise _naming(err, os.fspath(path)) from err
            raise
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        view = view[written:]


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append ``line`` (one JSONL record, no newline needed) to ``path`` and flush it to disk.

    On any failure (disk full, an interrupt) the file is cut back to its previous length: no torn line is
    left for the next append to run into. Readers still skip a torn last line, which only a kill during the
    write can leave.
    """
    path = os.fspath(path)
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            write_all(fd, data, path)
            os.fsync(fd)
            if start == 0:  # the file may be new: its name is an entry of the directory
                fsync_directory(os.path.dirname(path) or ".")
        except BaseException as err:
            os.ftruncate(fd, start)
            if start == 0:  # nothing was there: leave nothing
                os.unlink(path)
            if isinstance(err, OSError) and err.filename is None:
                raise _naming(err, path) from err
            raise
    finally:
        os.close(fd)


def keep_jsonl_records(path: str | os.PathLike[str], keep: Callable[[dict], bool]) -> int:
    """Keep the records of JSONL file ``path`` for which ``keep(record)`` holds, and drop a last line a kill
    cut short (no newline after it, not a JSON object); returns how many lines were dropped. The file is
    rewritten atomically, and only when something must go (a resume drops the records of the work it
    redoes: ``keep = lambda r: r["step"] <= checkpoint_step``) or its last record lacks its newline (the
    next append would be glued onto it).

    Raises:
        DataError: ``PATH:ROW: ...`` for any other line that is not a JSON object, or a record ``keep``
            cannot judge (a field missing or of the wrong type): a damaged record in the middle of a log
            is never deleted silently.
    """
    import json

    from patchword.errors import DataError

    path = os.fspath(path)
    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    lines = text.splitlines()
    kept, dropped = [], 0
    for row, line in enumerate(lines, start=1):
        if not line.strip():
            dropped += 1
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            record, why = None, f"invalid JSON ({err})"
        else:
            why = (
                None if isinstance(record, dict) else f"expected a JSON object, found {type(record).__name__}"
            )
        if why is not None:
            if row == len(lines) and not text.endswith("\n"):  # torn by a kill while it was appended
                dropped += 1
                continue
            raise DataError(
                f"{path}:{row}: not a JSONL record: {why}; only a last line a kill cut short is dropped: "
                "repair or remove this one"
            )
        try:
            ok = bool(keep(record))
        except (ValueError, KeyError, TypeError) as err:
            raise DataError(
                f"{path}:{row}: a record with a field missing or of the wrong type ({err!r})"
            ) from None
        if ok:
            kept.append(line)
        else:
            dropped += 1
    if dropped or (text and not text.endswith("\n")):
        atomic_write_text(path, "".join(f"{line}\n" for line in kept))
    return dropped


def repair_jsonl(path: str | os.PathLike[str]) -> int:
    """Drop what a kill during an :func:`append_line` left in JSONL file ``path`` (a torn last line, onto
    which the next record would be glued into one unreadable line) before appending to it; returns the
    lines dropped, logged as a warning."""
    dropped = keep_jsonl_records(path, lambda record: True)
    if dropped:
        _logger.warning("%s: dropped %d damaged line(s) left by an interrupted write", path, dropped)
    return dropped


def is_temp_of(filename: str, names: Collection[str]) -> bool:
    """Whether ``filename`` is a temporary file :func:`atomic_write` makes for one of ``names``:
    ``.{name}.{random}.tmp``, the random part as ``tempfile`` draws it (no dots), so ``.metrics.jsonl.X.tmp``
    is not one of ``metrics.json``."""
    match = re.fullmatch(r"\.(.+)\.[a-z0-9_]+\.tmp", filename)
    return match is not None and match.group(1) in names


def only_entries(
    directory: str | os.PathLike[str], names: Collection[str], temps_of: Collection[str] = ()
) -> list[str] | None:
    """The entries of ``directory`` when each is one of ``names`` or a temporary file of one of ``temps_of``
    (:func:`is_temp_of`); None when anything else is there or the directory does not exist. What tells a
    directory a command left (and may remove) from one holding something it did not write."""
    try:
        entries = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return None
    if all(name in names or is_temp_of(name, temps_of) for name in entries):
        return entries
    return None


def remove_stale_temps(directory: str | os.PathLike[str], names: Collection[str]) -> list[str]:
    """Delete the temporary files a kill during :func:`atomic_write` of ``names`` left in ``directory`` (a
    ``.last.pt.k3j9x1ab.tmp`` as large as the checkpoint, which nothing else ever removes); returns their
    names, and logs them.

    Call it only while holding the lock of whatever writes those files: a write in progress has a temporary
    file of the same form."""
    try:
        entries = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for name in entries:
        path = os.path.join(directory, name)
        if is_temp_of(name, names) and os.path.isfile(path) and not os.path.islink(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(name)
    if removed:
        _logger.info("%s: removed %s, left by a write a kill cut short", directory, ", ".join(removed))
    return removed


def replace_directory(stage: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """Put the filled directory ``stage`` (a :func:`staging_dir` of ``final``) in the place of ``final``.

    An absent or empty ``final`` is replaced in one rename. A non-empty one is renamed aside
    (``.{name}.replaced-XXXX``), ``stage`` renamed in, then the old one deleted: a kill at any moment leaves
    ``final`` holding the old set or the new one, whole, except between the two renames, where ``final`` is
    absent and the old set lies aside whole; :func:`recover_directory` puts it back. Replacing the files one
    at a time instead could leave new weights described by an old ``config.json``."""
    stage, final = os.fspath(stage), os.fspath(final)
    parent = os.path.dirname(os.path.abspath(final))
    if not os.path.isdir(final) or not os.listdir(final):
        os.replace(stage, final)  # a rename onto an empty directory replaces it
        fsync_directory(parent)
        return
    aside = staging_dir(final, "replaced")
    os.replace(final, aside)  # onto the empty directory mkdtemp made
    try:
        os.replace(stage, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.replace(aside, final)  # the old set back where it was
        raise
    fsync_directory(parent)
    shutil.rmtree(aside, ignore_errors=True)


def recover_directory(
    final: str | os.PathLike[str], required: Collection[str], staged: Collection[str] = ()
) -> None:
    """Finish what a kill during :func:`replace_directory` of ``final`` left beside it: with ``final``
    absent, the old set renamed aside is renamed back (when it holds every name in ``required``: a kill
    while it was being deleted leaves it partial, and ``final`` then holds the new set); the other
    directories set aside, and the :func:`staging_dir` folders of the labels ``staged`` (a kill while one
    was being filled), are deleted. Logs what it did. Two commands replacing one ``final`` at once are not
    supported: the second would delete the first's staging folder (the first then fails; ``final`` stays
    whole)."""
    final = os.fspath(final)
    parent, name = os.path.dirname(final) or ".", os.path.basename(final)
    if not os.path.isdir(parent):
        return
    prefixes = tuple(f".{name}.{label}-" for label in ("replaced", *staged))
    left = sorted(os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(prefixes))
    left = [path for path in left if os.path.isdir(path) and not os.path.islink(path)]
    if not os.path.exists(final):
        asides = [p for p in left if os.path.basename(p).startswith(prefixes[0])]
        whole = [p for p in asides if all(os.path.isfile(os.path.join(p, r)) for r in required)]
        if whole:
            restored = max(whole, key=os.path.getmtime)
            os.replace(restored, final)
            left.remove(restored)
            _logger.warning("%s restored from %s: a kill interrupted replacing it", final, restored)
    for path in left:
        shutil.rmtree(path, ignore_errors=True)
        _logger.info("removed %s, left by a kill while %s was being written", path, final)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 (hex) of a file's bytes, read 1 MiB at a time (a checkpoint can be gigabytes): what identifies
    a file whatever its name or date."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def probe_writable(directory: str | os.PathLike[str]) -> None:
    """Check, before any work, that files can be created in ``directory`` or, when it does not exist yet,
    in its nearest existing parent (nothing is created there): a read-only or vanished location fails now,
    with ``OSError`` naming it, instead of after an hour of work."""
    target = folder = os.path.abspath(os.fspath(directory))
    while not os.path.isdir(folder):
        if os.path.exists(folder):  # a file where a directory must go
            raise NotADirectoryError(20, "Not a directory", folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".patchword-probe.")
    except OSError as err:
        code = f" ({errno.errorcode[err.errno]})" if err.errno in errno.errorcode else ""
        reason = f"{err.strerror or err}{code}"
        where = (
            f"{folder}: cannot write here"
            if folder == target
            else f"cannot create {target}: {folder} takes no new files"
        )
        # One argument, the whole line: OSError(errno, ...) would become FileNotFoundError for ENOENT (as
        # /proc answers), which prints as "[Errno 2] ...", and its file name would be the probe's temp file.
        raise type(err)(f"{where}: {reason}") from err
    os.close(fd)
    os.unlink(tmp)


def check_output_file(out: str | os.PathLike[str], force: bool, flag: str = "--out") -> None:
    """Before any work, the file a command will write: not a directory, not an existing file (unless
    ``force``), in an existing directory that takes files. Raises the errors the command line prints as
    one line naming ``flag`` (``ConfigError``, ``RunExistsError``, ``OSError`` naming the directory)."""
    from patchword.errors import ConfigError, RunExistsError

    out = os.fspath(out)
    folder = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(out):
        raise ConfigError(flag, f"{out} is a directory: {flag} names the file to write")
    if os.path.exists(out) and not force:
        raise RunExistsError(f"{out} exists; pass --force to overwrite it or {flag} for another file")
    if not os.path.isdir(folder):
        blocker = _not_a_directory(folder)
        if blocker == folder:
            raise ConfigError(flag, f"directory {folder} {_is_not_a_folder(folder)}")
        above = f" ({blocker} {_is_not_a_folder(blocker)})" if blocker else ""
        raise ConfigError(flag, f"directory {folder} does not exist{above}")
    probe_writable(folder)


def check_output_dir(out: str | os.PathLike[str], flag: str, what: str = "the directory to write") -> None:
    """Before any work, the directory a command will write into (made, with its missing parents, when it
    does not exist): not a file, no file where one of its parents must go, and files can be created in it
    (or in its nearest existing parent: :func:`probe_writable`; nothing is created). ``flag``: the flag or
    config key that named ``out`` (``--out``, ``output_dir``); ``what``: what ``flag`` names, for the
    message of a file in its place.

    Raises:
        ConfigError: naming ``flag``: ``out``, or one of its parents, is a file (naming it); files cannot be
            created there (read-only, vanished: the directory and the reason).
    """
    from patchword.errors import ConfigError, describe_os_error

    shown, path = os.fspath(out), os.path.abspath(os.fspath(out))
    blocker = _not_a_directory(path)
    if blocker == path:
        raise ConfigError(flag, f"{shown} {_is_not_a_folder(path)}: {flag} names {what}")
    if blocker is not None:
        raise ConfigError(flag, f"{blocker} {_is_not_a_folder(blocker)}: {shown} cannot be created under it")
    try:
        probe_writable(path)
    except OSError as err:
        raise ConfigError(flag, describe_os_error(err)) from err


def _not_a_directory(path: str) -> str | None:
    """The nearest existing entry of absolute ``path`` and its parents when it is not a directory (a file, a
    dangling link): what makes creating ``path`` fail with ``ENOTDIR`` (``EEXIST`` for ``path`` itself)."""
    folder = path
    while not os.path.lexists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    return None if os.path.isdir(folder) else folder


def _is_not_a_folder(path: str) -> str:
    return "is a file" if os.path.isfile(path) else "is not a directory"
