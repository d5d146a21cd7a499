"""One console for reports (stdout), one for progress and errors (stderr), and abort()."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from amptool.errors import EXIT_INTERNAL_ERROR, EXIT_USER_ERROR, UserError, error_summary
from amptool.fileio import WRITE_ERRNOS, os_error_line


def _console(stderr: bool) -> Console:
    # Pipes and CI logs get a fixed width of 120 so tables are not squeezed to 80 columns.
    probe = Console(stderr=stderr)
    width = None if probe.is_terminal else 120
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr, width=width)


out = _console(stderr=False)
err = _console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def abort(error: UserError) -> NoReturn:
    """Print a user error as one line (plus a hint line) and exit with its code.

    Message and hint are text, not markup: ``amptool[plot]`` or ``a[1].npz`` print intact."""
    err.print(f"[bold red]error:[/] {escape(error.message)}", markup=True, highlight=False)
    if error.hint:
        err.print(f"[dim]hint:[/] {escape(error.hint)}")
    sys.exit(getattr(error, "exit_code", EXIT_USER_ERROR))


def handles_user_errors(fn: F) -> F:
    """UserError → one line + its exit code. Anything else is a bug in amptool or TVM: one line and
    exit 70 (never 1, which CI reads as "accuracy failed"); the traceback only with ``-v``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as error:
            abort(error)
        except KeyboardInterrupt:
            err.print("interrupted")
            sys.exit(130)
        except OSError as error:
            if error.errno in WRITE_ERRNOS and error.filename:
                abort(UserError(f"Cannot use {error.filename}: {os_error_line(error)}",
                                "Check the path, its permissions and the free disk space."))
            internal_error(error)
        except MemoryError as error:
            abort(UserError(f"Out of memory{': ' + str(error) if str(error) else ''}",
                            "Pin smaller input shapes (--input-shape) or use a machine with more memory."))
        except Exception as error:  # noqa: BLE001 - the one place a bug becomes an exit code
            internal_error(error)

    return wrapper  # type: ignore[return-value]


def internal_error(error: BaseException) -> NoReturn:
    """A bug: one line naming it, the traceback under ``-v``, exit 70 (EX_SOFTWARE)."""
    if _verbosity > 0:
        err.print_exception(show_locals=False)
    text = error_summary(error, last=str(error).lstrip().startswith("Traceback"))
    err.print(f"[bold red]internal error:[/] {escape(type(error).__name__)}: {escape(text)} "
              "(please report; -v shows the traceback)", markup=True, highlight=False)
    sys.exit(EXIT_INTERNAL_ERROR)


@contextlib.contextmanager
def stages(enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """Progress on stderr, one entry per pipeline stage, with the seconds since the start.

    A terminal gets a spinner whose clock keeps running; a pipe or CI log gets one line per stage
    (``[  12.3s] compile``), because a log that stays silent for minutes looks hung. ``-q`` turns
    both off."""
    start = time.perf_counter()
    log = logging.getLogger("amptool")
    if not enabled or _quiet:
        yield lambda name: log.info("stage: %s", name)
        return
    if not err.is_terminal:
        def line(name: str) -> None:
            err.print(f"[{time.perf_counter() - start:7.1f}s] {name}", markup=False, highlight=False)

        yield line
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True) as progress:
        task = progress.add_task("starting…", total=None)
        yield lambda name: progress.update(task, description=f"[bold]{escape(name)}[/]…")


_verbosity = 0
_quiet = False


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (a test runner swaps it per invocation)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def setup_logging(verbose: int, quiet: bool = False) -> None:
    """Logging level from ``-v`` (INFO, ``-vv`` DEBUG) or ``-q`` (errors only). Called again by
    a command that got ``-v``/``-q`` after its name: the counts add up."""
    global _verbosity, _quiet
    _verbosity = verbose
    _quiet = quiet and verbose == 0
    level = (logging.ERROR if _quiet else logging.WARNING if verbose == 0
             else logging.INFO if verbose == 1 else logging.DEBUG)
    root = logging.getLogger()
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)


def is_quiet() -> bool:
    """``-q`` was given: no progress and no warnings, only errors and results."""
    return _quiet


def _add_verbosity(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
    """``-v``/``-q`` given after the verb: add to what the group got."""
    if value:
        verbose = _verbosity + (value if isinstance(value, int) and not isinstance(value, bool) else 0)
        setup_logging(verbose, _quiet or value is True)


def verbosity_options(fn: F) -> F:
    """``-v``/``--verbose`` and ``-q``/``--quiet`` on a command, so they work before or after the verb."""
    fn = click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_add_verbosity,
                      help="Only results and errors: no progress, no warnings.")(fn)
    return click.option("-v", "--verbose", count=True, expose_value=False, callback=_add_verbosity,
                        help="More logging on stderr (-vv for debug); a bug shows its traceback.")(fn)
