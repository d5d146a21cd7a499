"""The ``amptool`` command group. Commands import their heavy modules lazily (fast --help)."""

from __future__ import annotations

import click

from amptool import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="amptool")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug).")
def cli(verbose: int) -> None:
    """Convert ONNX models to float16/bfloat16 with TVM Relax, and prove they still work.

    \b
    Exit codes: 0 ok/passed, 1 accuracy check failed, 2 user error, 3 target unavailable,
    70 internal error (a bug: please report; -v shows the traceback).
    """
    from amptool.cli.console import setup_logging  # noqa: PLC0415

    setup_logging(verbose)


def _register() -> None:
    from amptool.cli import bench_cmd, convert_cmd, diff_cmd, inspect_cmd, run_cmd  # noqa: PLC0415

    cli.add_command(convert_cmd.convert)
    cli.add_command(diff_cmd.diff)
    cli.add_command(inspect_cmd.inspect)
    cli.add_command(bench_cmd.bench)
    cli.add_command(run_cmd.run)


_register()


def main() -> None:
    cli(prog_name="amptool")


if __name__ == "__main__":  # pragma: no cover
    main()
