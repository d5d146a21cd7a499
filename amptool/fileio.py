"""Never leave a half-written output, never write through somebody else's file.

Every file amptool writes (``--json``, ``--save-inputs``, ``--save-outputs``, ``--emit-ir``,
``--plot``, ``run -o``) goes through :func:`atomic_write`: the data goes into a temporary file
created exclusively (``mkstemp``: ``O_CREAT | O_EXCL``, a random name, so a symlink or file
planted beside the target is neither followed nor removed) in the target's own directory, and
is renamed over the target only once complete. The rename replaces the directory entry: if the
target itself is a symlink, the link is replaced and what it pointed to is left unchanged.

Operating-system failures on the way (read-only or full disk, no permission) become one-line
user errors naming the path, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from amptool.errors import UserError

#: Suffix of every temporary file amptool creates next to a target.
TMP_SUFFIX = ".amptool-tmp"

#: errno values that mean "this path cannot be written here", not a bug.
WRITE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                          errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.EFBIG,
                          errno.EEXIST, errno.ELOOP})


def os_error_line(err: OSError) -> str:
    """``No space left on device`` rather than ``[Errno 28] …``."""
    return err.strerror or str(err)


def write_error(path: str, err: OSError, what: str = "") -> UserError:
    """A one-line UserError for an OSError met while writing ``path``."""
    label = f"{what} {path}" if what else path
    return UserError(f"Cannot write {label}: {os_error_line(err)}",
                     "Choose a path in a writable directory with free space.")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def public_mode(directory: bool = False) -> int:
    """The permissions an ordinary ``open``/``mkdir`` would have given (mkstemp/mkdtemp use 0600/0700)."""
    return (0o777 if directory else 0o666) & ~_umask()


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", what: str = "") -> Iterator[IO[Any]]:
    """Yield a file opened on a fresh temporary sibling of ``path``; it replaces ``path`` on success.

    ``mode`` is ``"w"`` (text, UTF-8) or ``"wb"``. ``what`` names the flag for error messages."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode {mode!r}")
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise UserError(f"Cannot write {what + ' ' if what else ''}{path}: it is a directory",
                        "Name a file, e.g. out/report.json.")
    directory = os.path.dirname(target)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=TMP_SUFFIX, dir=directory)
    except OSError as err:
        raise write_error(path, err, what) from err
    try:
        os.fchmod(fd, public_mode())
        handle: IO[Any] = os.fdopen(fd, "wb") if mode == "wb" else os.fdopen(fd, "w", encoding="utf-8")
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as err:
        _remove_quietly(tmp)
        raise write_error(path, err, what) from err
    except BaseException:
        _remove_quietly(tmp)
        raise


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def write_json(path: str, payload: Any, what: str = "--json") -> None:
    with atomic_write(path, "w", what) as handle:
        json.dump(payload, handle, indent=2, allow_nan=False)
        handle.write("\n")


def check_writable_file(path: str, what: str, hint: str) -> None:
    """Refuse, before any work, a file path that cannot be written: a directory, or one whose
    nearest existing ancestor is not a writable directory (one-line UserError)."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if os.path.isdir(path) or not os.path.isdir(existing) or not os.access(existing, os.W_OK):
        why = "is a directory" if os.path.isdir(path) else f"cannot be created in {existing}"
        raise UserError(f"{what} {path}: {why}", hint)


def check_regular_file(path: str, what: str, hint: str | None = None, *, max_bytes: int | None = None) -> int:
    """The size of ``path`` if it is a regular file (not a device, FIFO or directory) no larger than
    ``max_bytes``; else a one-line UserError. Reading ``/dev/zero`` as a model would never end."""
    try:
        info = os.stat(path)
    except FileNotFoundError as err:
        raise UserError(f"{what} not found: {path}", hint or "Check the path.") from err
    except OSError as err:
        raise UserError(f"{what} {path} cannot be read: {os_error_line(err)}", hint) from err
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{what} {path} is a directory, not a file", hint)
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{what} {path} is not a regular file (a device, pipe or socket)",
                        hint or "Pass a file on disk.")
    if max_bytes is not None and info.st_size > max_bytes:
        raise UserError(f"{what} {path} is {info.st_size / 2**30:.1f} GiB, more than this machine's "
                        f"{max_bytes / 2**30:.1f} GiB of memory", "Run amptool on a machine with more memory.")
    return info.st_size


def physical_memory() -> int | None:
    """Bytes of physical memory, or None where unknown: a file larger than this cannot be loaded."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def finite_only(value: Any) -> Any:
    """JSON has no Inf/NaN: non-finite floats become null (counts elsewhere say what happened)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_only(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_only(v) for v in value]
    return value
