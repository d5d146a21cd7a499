"""One ``--json`` for every verb: ``--json PATH`` writes a file atomically, ``--json -`` (or a bare
``--json``) prints to stdout — and then stdout carries the JSON only: tables and summary lines go
to stderr (:func:`report_console`), so ``amptool diff m.onnx --json - | jq`` reads one document.

Every document is stamped with ``schema_version`` and ``versions`` (``app.versions.stamp``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click
from rich.console import Console

from amptool.app.versions import stamp
from amptool.cli.console import err, out
from amptool.fileio import finite_only, write_json

#: The value that sends JSON to stdout.
STDOUT = "-"

F = TypeVar("F", bound=Callable[..., Any])


def json_option(what: str) -> Callable[[F], F]:
    """``--json [PATH|-]`` into the parameter ``json_path``; alone, ``--json`` means ``-`` (stdout)."""
    return click.option(
        "--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True), is_flag=False, flag_value=STDOUT,
        default=None, metavar="[PATH|-]",
        help=f"{what} as JSON to PATH (written atomically), or to stdout with '-' or a bare --json "
        "(then stdout carries only the JSON; tables go to stderr).",
    )


def json_to_stdout(json_path: str | None) -> bool:
    return json_path == STDOUT


def report_console(json_path: str | None) -> Console:
    """Where tables and summary lines go: stdout, unless the JSON owns it."""
    return err if json_to_stdout(json_path) else out


def emit_json(json_path: str | None, payload: Mapping[str, Any]) -> None:
    """Stamp ``payload`` and write it to ``json_path`` (atomically) or to stdout for ``-``; None: nothing."""
    if json_path is None:
        return
    document = finite_only(stamp(payload))
    if json_to_stdout(json_path):
        click.echo(json.dumps(document, indent=2, allow_nan=False))
    else:
        write_json(json_path, document)
