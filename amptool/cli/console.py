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

from amptool.errors import EXIT_USER_ERROR, UserError


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
    """Turn UserError into one line + exit code; anything else stays a traceback (a bug)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as error:
            abort(error)
        except KeyboardInterrupt:
            err.print("interrupted")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def stages(enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr naming the current pipeline stage."""
    if not enabled or not err.is_terminal:
        yield lambda name: logging.getLogger("amptool").info("stage: %s", name)
        return
    with err.status("starting…") as status:
        yield lambda name: status.update(f"[bold]{name}[/]…")


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
