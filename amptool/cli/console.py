"""One console for reports (stdout), one for progress and errors (stderr), and abort()."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

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
    """A spinner on stderr naming the current pipeline stage."""
    if not enabled or not err.is_terminal:
        yield lambda name: logging.getLogger("amptool").info("stage: %s", name)
        return
    with err.status("starting…") as status:
        yield lambda name: status.update(f"[bold]{name}[/]…")


_verbosity = 0


def setup_logging(verbose: int) -> None:
    global _verbosity
    _verbosity = verbose
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
