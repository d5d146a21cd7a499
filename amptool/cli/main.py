"""The ``amptool`` command group. Commands import their heavy modules lazily (fast --help)."""

from __future__ import annotations

from typing import Any

import click


def versions_text() -> str:
    """One line per package: amptool's and its engines'; fast (package metadata, no TVM import)."""
    from amptool.app.versions import versions  # noqa: PLC0415

    return "\n".join(f"{name} {version}" for name, version in versions().items())


def _print_versions(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(versions_text())
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_versions,
              help="Print the versions of amptool, TVM, onnxruntime and onnx, and exit.")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug); also after the verb.")
@click.option("-q", "--quiet", is_flag=True,
              help="Only results and errors: no progress, no warnings; also after the verb.")
def cli(verbose: int, quiet: bool) -> None:
    """Convert ONNX models to float16/bfloat16 with TVM Relax, and prove they still work.

    \b
    Exit codes: 0 ok/passed, 1 accuracy check failed, 2 user error, 3 target unavailable,
    70 internal error (a bug: please report; -v shows the traceback).
    """
    from amptool.cli.console import setup_logging  # noqa: PLC0415

    setup_logging(verbose, quiet)


def _register() -> None:
    from amptool.cli import bench_cmd, convert_cmd, diff_cmd, inspect_cmd, run_cmd  # noqa: PLC0415

    cli.add_command(convert_cmd.convert)
    cli.add_command(diff_cmd.diff)
    cli.add_command(inspect_cmd.inspect)
    cli.add_command(bench_cmd.bench)
    cli.add_command(run_cmd.run)


_register()


def main() -> None:
    _keep_freed_memory()
    try:
        cli(prog_name="amptool")
    except SystemExit as done:
        _exit_now(done.code)


#: glibc's mallopt parameters (malloc.h): the heap top kept unreturned, and how many blocks may be mmapped.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def _keep_freed_memory() -> None:
    """Have glibc's malloc serve every block from its heap and keep freed memory for reuse.

    Why: by default each block over 32 MB is mmapped and unmapped on free, so every copy of a
    model's weights (the file read, protobuf's parse, onnxruntime's sessions, TVM's constants) lands
    in fresh pages the kernel faults in and zeroes one by one: a ResNet-50 convert faulted 2.6 GB
    for a 1.2 GB peak, 2 s of system time. Reused memory needs no faults: the convert went 7.1 →
    6.3 s (median of 6 each way, 2 cores; peak memory +8%). Only the CLI process does this, which
    exits after one command; a library user's process keeps its own malloc settings. Not glibc
    (musl, macOS): nothing to do.
    """
    import ctypes  # noqa: PLC0415
    import sys  # noqa: PLC0415

    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_MAX, 0)
    mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)


def _exit_now(code: int | str | None) -> None:
    """Exit with ``code`` without Python's teardown, once output is flushed.

    Why: the teardown after a ResNet-50 convert took 0.36 s of its ~6.5 (freeing TVM's and
    onnxruntime's objects, their libraries' static destructors; measured), and every file
    amptool writes is closed and renamed into place before this point. With child processes
    still running (a bench worker), or under a profiler or tracer (cProfile, coverage), the
    normal exit runs, so that they are joined and the tools write their data.
    """
    import logging  # noqa: PLC0415
    import multiprocessing  # noqa: PLC0415
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if multiprocessing.active_children() or sys.getprofile() or sys.gettrace():
        raise SystemExit(code)  # a profiler or coverage writes its data at exit
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
