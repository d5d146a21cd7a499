"""Output directories that never lose a user's file and are replaced atomically.

``-o DIR`` is written only when DIR does not exist, is empty, or holds an amptool artifact and
nothing else (recognised from its ``manifest.json``, whose ``files`` key lists what amptool wrote).
Anything else — a directory holding the input model, the working directory, a user's notes — is
refused before anything is built, naming a foreign file, and is never touched.

How a new artifact lands:
  1. it is written into a private sibling ``.DIR.amptool-tmp-PID-XXXX`` (``mkdtemp``: exclusive,
     never a followed symlink); TVM's own export temporaries live inside it, too;
  2. under an exclusive ``flock`` on the parent directory (concurrent writers queue here; the
     last one wins whole), DIR is checked again, then swapped with the new directory in one
     ``renameat2(RENAME_EXCHANGE)``: a reader of DIR sees the old artifact or the new one,
     never none and never a mixture of files;
  3. the old artifact, now under the temporary name, is removed (only the files it lists).

Where the filesystem cannot exchange (``EINVAL``/``ENOSYS``: some network filesystems), DIR is
renamed aside and the new one renamed in: still never a half-written DIR, but a reader may
find DIR missing for the instant between the renames. When the working directory is DIR (or
inside it) the files are renamed in one by one, the manifest last, so the shell is not left in
a moved directory.

A run killed half-way leaves its temporary sibling behind; the next write into the same parent
removes every such sibling whose process is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator

from amptool.errors import UserError
from amptool.fileio import public_mode, write_error

MANIFEST_NAME = "manifest.json"
#: What an artifact directory written before the manifest listed its files may hold.
LEGACY_ARTIFACT_FILES = frozenset({"manifest.json", "model.so", "lowered.py", "fallback.yaml"})
_TMP_MARK = ".amptool-tmp-"
_TMP_PATTERN = re.compile(r"^\..*\.amptool-tmp-(\d+)-[^/]*$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def artifact_files(directory: str) -> frozenset[str] | None:
    """The names amptool wrote into ``directory`` if it holds an amptool manifest; else None."""
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), list) for k in ("inputs", "outputs")):
        return None
    listed = manifest.get("files")
    if isinstance(listed, list) and all(isinstance(n, str) and "/" not in n for n in listed):
        return frozenset(listed) | {MANIFEST_NAME}
    return LEGACY_ARTIFACT_FILES


def _resolved(output_dir: str) -> str:
    """Where the artifact lands: a symlink to a directory (``out -> /big/disk/out``) stays a link,
    and the directory it names is the one replaced."""
    if os.path.islink(output_dir) and os.path.isdir(output_dir):
        return os.path.realpath(output_dir)
    return os.path.abspath(output_dir)


def check_output_dir(output_dir: str, flag: str = "-o") -> None:
    """Raise UserError unless ``output_dir`` may be written (see the module docstring)."""
    if not output_dir.strip():
        raise UserError(f"{flag} is empty", "Name the output directory, e.g. -o out/model-fp16.")
    target = _resolved(output_dir)
    parent = os.path.dirname(target)
    while parent and not os.path.lexists(parent):  # the nearest ancestor that exists
        up = os.path.dirname(parent)
        parent = "" if up == parent else up
    if parent and not os.path.isdir(parent):  # found before the build, not as "File exists" after it
        raise UserError(f"{flag} {output_dir}: '{parent}' is a file, not a directory",
                        "Name an output directory whose parents are directories.")
    if os.path.lexists(target) and not os.path.isdir(target):
        raise UserError(f"{flag} {output_dir}: exists and is not a directory",
                        "Name a new directory, or an artifact directory written by amptool.")
    if not os.path.isdir(target):
        return
    try:
        entries = sorted(os.listdir(target))
    except OSError as err:
        raise UserError(f"{flag} {output_dir}: cannot be read ({err.strerror})") from err
    if not entries:
        return
    ours = artifact_files(target)
    foreign = [name for name in entries if ours is None or name not in ours]
    if foreign:
        what = "is not an amptool artifact" if ours is None else "holds files amptool did not write"
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UserError(
            f"{flag} {output_dir} {what} (found '{foreign[0]}'{more}); amptool writes only into a new, empty "
            "or artifact directory and leaves this one untouched",
            "Choose another output directory, e.g. -o out/model-fp16.",
        )


def check_outside(output_dir: str, path: str | None, flag: str, output_flag: str = "-o") -> None:
    """Raise UserError when ``path`` (a file another flag writes) lies inside ``output_dir``: the
    artifact replaces that directory as a whole, so the file would be lost, or refuse the next run."""
    if not path or path == "-":
        return
    target, inner = _resolved(output_dir), _resolved(path)
    if os.path.commonpath([target, inner]) == target:
        beside = os.path.join(os.path.dirname(target) or ".", os.path.basename(inner))
        raise UserError(f"{flag} {path} is inside {output_flag} {output_dir}, which amptool writes as a whole",
                        f"Write it beside the directory, e.g. {flag} {beside}.")


def write_directory(output_dir: str, write_files: Callable[[str], list[str]], flag: str = "-o") -> None:
    """``write_files(tmpdir)`` fills a private temporary directory and returns the names it wrote;
    the directory then replaces ``output_dir`` atomically (see the module docstring)."""
    check_output_dir(output_dir, flag)
    target = _resolved(output_dir)
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        remove_stale_temporaries(parent)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}{_TMP_MARK}{os.getpid()}-", dir=parent)
    except OSError as err:
        raise write_error(output_dir, err, flag) from err
    try:
        with _temporaries_inside(tmp):
            written = write_files(tmp)
        os.chmod(tmp, public_mode(directory=True))
        with _locked(parent):
            check_output_dir(output_dir, flag)  # again: another writer may have been here meanwhile
            _swap_in(tmp, target, frozenset(written))
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(output_dir, err, flag) from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_temporaries(parent: str) -> list[str]:
    """Remove ``.NAME.amptool-tmp-PID-*`` siblings whose process is gone (a killed run's leftovers)."""
    removed = []
    for name in os.listdir(parent):
        match = _TMP_PATTERN.match(name)
        if match and not _process_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(name)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _temporaries_inside(directory: str) -> Iterator[None]:
    """Point Python's and child processes' temporary files (TVM's export, the linker's) into
    ``directory``'s private ``.tmp`` for the duration, so a kill leaves nothing elsewhere."""
    scratch = os.path.join(directory, ".tmp")
    os.mkdir(scratch)
    saved_tempdir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = scratch
    os.environ["TMPDIR"] = scratch
    try:
        yield
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _locked(parent: str) -> Iterator[None]:
    """An exclusive flock on the parent directory: one writer at a time swaps and cleans up."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _swap_in(new: str, target: str, written: frozenset[str]) -> None:
    if not os.path.isdir(target):
        os.rename(new, target)
        return
    if _cwd_inside(target):
        _move_files_in(new, target, written)
        return
    if _exchange(new, target):
        _remove_artifact(new)
        return
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}{_TMP_MARK}{os.getpid()}-old-",
                             dir=os.path.dirname(target))
    os.rmdir(aside)
    os.rename(target, aside)
    os.rename(new, target)
    _remove_artifact(aside)


def _exchange(a: str, b: str) -> bool:
    """Swap two directory entries atomically; False where the kernel or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(code, os.strerror(code), b)


def _cwd_inside(target: str) -> bool:
    try:
        cwd = os.getcwd()
    except OSError:
        return False
    return cwd == target or cwd.startswith(target + os.sep)


def _move_files_in(new: str, target: str, written: frozenset[str]) -> None:
    """Rename each new file over its old name, the manifest last; drop old amptool files not rewritten."""
    old = artifact_files(target) or frozenset()
    for name in sorted(written - {MANIFEST_NAME}) + [MANIFEST_NAME]:
        if os.path.lexists(os.path.join(new, name)):
            os.replace(os.path.join(new, name), os.path.join(target, name))
    for name in old - written:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.remove(os.path.join(target, name))
    shutil.rmtree(new, ignore_errors=True)


def _remove_artifact(directory: str) -> None:
    """Remove a replaced artifact: the files its manifest lists, then the directory if that empties it."""
    listed = artifact_files(directory) or frozenset()
    for name in listed:
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(directory)
