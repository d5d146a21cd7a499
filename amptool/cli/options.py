"""Options shared by commands that build a model (convert, diff, inspect, bench)."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any

import click

from amptool.app.convert import DTYPES
from amptool.cli.console import abort, verbosity_options
from amptool.errors import UserError
from amptool.frontend.input_values import parse_dim, parse_fixed_input, parse_input_shapes

fixed_input_option = click.option(
    "--fixed-input", "fixed_inputs", multiple=True, metavar="NAME=VALUE",
    help="Bake an input in as a constant (repeatable), e.g. sr=16000: control flow on its "
         "value then folds, and only the live branch is imported.",
)

calibration_option = click.option(
    "--calibration", "calibration", metavar="X.npz", default=None,
    help="Inputs on which to measure activation ranges for the range guard "
         "(default: the seeded random inputs diff uses).",
)

validation_option = click.option(
    "--validation", "validation", metavar="X.npz", default=None, type=click.Path(exists=True, dir_okay=False),
    help="With --auto-fallback: held-out inputs (one array per model input) the colours found must also pass "
         "(default: the 4 seeds after the search's).",
)

low_precision_io_option = click.option(
    "--low-precision-io", is_flag=True,
    help="Take and return float32 tensors in the low dtype (the caller holds fp16/bf16 data).",
)

cuda_arch_option = click.option(
    "--cuda-arch", "cuda_arch", metavar="sm_XX", default=None,
    help="CUDA architecture for --target cuda  [default: the local GPU's, else sm_90].",
)

target_options_option = click.option(
    "--target-options", "target_options", multiple=True, metavar="'-mcpu=NAME -mattr=+F,-G'",
    help="LLVM options for --target llvm  [default: -mcpu of this host's CPU].",
)


class ByteSize(click.ParamType):
    """``4GiB``, ``500MB``, ``1e9`` or a plain byte count → int bytes (parsed here, once)."""

    name = "size"
    _UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 1 << 10, "m": 10**6, "mb": 10**6, "mib": 1 << 20,
              "g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12, "tib": 1 << 40}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        try:
            number = float(match.group(1)) if match else math.nan
        except ValueError:
            number = math.nan
        if not match or unit not in self._UNITS or not (math.isfinite(number) and number > 0):
            self.fail(f"'{value}' is not a size like 4GiB, 500MB or 1000000", param, ctx)
        return int(number * self._UNITS[unit])


class DtypeChoice(click.Choice):
    """``float16|bfloat16|float32``, also written ``fp16``, ``half``, ``bf16``, ``fp32``, ``float`` …:
    the aliases become the canonical name here, at the edge, so nothing below sees them."""

    ALIASES = {"fp16": "float16", "f16": "float16", "half": "float16", "float16": "float16",
               "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp32": "float32", "f32": "float32", "float": "float32", "single": "float32", "float32": "float32"}

    def __init__(self) -> None:
        super().__init__(DTYPES)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        canonical = self.ALIASES.get(str(value).strip().lower(), value)
        return super().convert(canonical, param, ctx)


#: The options of ``build_options``, in --help order.
_BUILD_DECORATORS = [
    click.option("--colors", metavar="FILE.yaml|builtin:NAME", default=None,
                 help="Colour lists (ALWAYS/FOLLOW/NEVER); default builtin:default."),
    click.option("--target", default="llvm", show_default=True, metavar="llvm|cuda|vulkan",
                 help="Compilation target."),
    cuda_arch_option,
    target_options_option,
    click.option("--input-shape", "--input-shapes", "input_shapes", multiple=True, metavar="NAME:1x3x224x224",
                 help="Pin an input's shape (repeatable; also NAME:[1,3,224,224]); needed for dynamic dims."),
    click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                 help="Set the symbolic dim NAME (dim_param) in every input, e.g. batch=8 (repeatable)."),
    click.option("--exclude-op", "exclude_ops", multiple=True, metavar="OP",
                 help="Keep every node of this op type float32, e.g. Softmax or relax.nn.softmax (repeatable)."),
    click.option("--exclude-node", "exclude_nodes", multiple=True, metavar="PATTERN",
                 help="Keep ONNX nodes whose name matches float32: a glob or a /regex/ (repeatable)."),
    fixed_input_option,
    calibration_option,
    low_precision_io_option,
    click.option("--no-range-guards", is_flag=True,
                 help="Cast constants even when they overflow/underflow the low dtype."),
    click.option("--no-cancellation-guard", is_flag=True,
                 help="Let Add/Sub ops whose result cancels far below their operands (and what makes "
                      "those operands) compute in the low dtype."),
    click.option("--no-prepare", is_flag=True,
                 help="Skip onnxruntime's fp32 constant/BatchNorm folding before import."),
    click.option("--no-concretize", is_flag=True,
                 help="Keep *_like ops and shape_of patterns as imported (skip ConcretizeLike)."),
    click.option("--max-input-size", "max_input_bytes", type=ByteSize(), default="4GiB", show_default=True,
                 metavar="SIZE", help="Refuse models whose inputs of one run take more (e.g. 16GiB, 500MB)."),
]

dtype_option = click.option("--dtype", type=DtypeChoice(), default="float16", show_default=True,
                            help="Low-precision dtype (also fp16/half, bf16, fp32; float32: the unconverted baseline).")


def build_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every option that decides how a model is built except its dtype. The command receives
    them as one keyword argument, ``build``: ConvertConfig fields, so that
    ``ConvertConfig(model=…, dtype=…, **build)`` is the one place flags become a config."""

    @functools.wraps(fn)
    def with_build(*args: Any, **kwargs: Any) -> Any:
        try:  # parse at the edge: the library takes typed values
            shapes = parse_input_shapes(kwargs.pop("input_shapes"))
            fixed = dict(parse_fixed_input(text) for text in kwargs.pop("fixed_inputs"))
            dims = dict(parse_dim(text) for text in kwargs.pop("dims"))
        except UserError as error:
            abort(error)
        kwargs["build"] = {
            "colors": kwargs.pop("colors"),
            "target": kwargs.pop("target"),
            "cuda_arch": kwargs.pop("cuda_arch"),
            "target_options": kwargs.pop("target_options"),
            "input_shapes": shapes,
            "fixed_inputs": fixed,
            "calibration": kwargs.pop("calibration"),
            "low_precision_io": kwargs.pop("low_precision_io"),
            "range_guards": not kwargs.pop("no_range_guards"),
            "cancellation_guard": not kwargs.pop("no_cancellation_guard"),
            "prepare": not kwargs.pop("no_prepare"),
            "concretize": not kwargs.pop("no_concretize"),
            "max_input_bytes": kwargs.pop("max_input_bytes"),
            "dims": dims,
            "exclude_ops": tuple(kwargs.pop("exclude_ops")),
            "exclude_nodes": tuple(kwargs.pop("exclude_nodes")),
        }
        return fn(*args, **kwargs)

    decorated: Callable[..., Any] = verbosity_options(with_build)  # -v/-q after the verb too
    for decorator in reversed(_BUILD_DECORATORS):
        decorated = decorator(decorated)
    return decorated


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--dtype`` plus ``build_options``: what convert, diff and inspect take."""
    return dtype_option(build_options(fn))


#: The options of ``rpc_options``, in --help order.
_RPC_DECORATORS = [
    click.option("--rpc", "rpc_tracker", metavar="HOST:PORT", default=None,
                 help="Run on a device from this TVM RPC tracker (with --rpc-key); see docs/remote.md."),
    click.option("--rpc-key", "rpc_key", metavar="KEY", default=None,
                 help="The tracker key of the devices to use, e.g. rasp4 (what the servers registered with --key)."),
    click.option("--rpc-server", "rpc_server", metavar="HOST:PORT", default=None,
                 help="Run on the device of this one TVM RPC server (no tracker)."),
    click.option("--rpc-timeout", "rpc_timeout", type=float, default=60.0, show_default=True, metavar="SECONDS",
                 help="Longest wait for the remote: for a free device, then for each answer; past it, exit 3."),
]


def rpc_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--rpc``/``--rpc-key``/``--rpc-server``/``--rpc-timeout``, given to the command as one keyword
    argument, ``remote``: a ``RemoteSpec``, or None to run here."""

    @functools.wraps(fn)
    def with_remote(*args: Any, **kwargs: Any) -> Any:
        try:
            kwargs["remote"] = parse_remote(kwargs.pop("rpc_tracker"), kwargs.pop("rpc_key"),
                                            kwargs.pop("rpc_server"), kwargs.pop("rpc_timeout"))
        except UserError as error:
            abort(error)
        return fn(*args, **kwargs)

    decorated: Callable[..., Any] = with_remote
    for decorator in reversed(_RPC_DECORATORS):
        decorated = decorator(decorated)
    return decorated


def parse_remote(tracker: str | None, key: str | None, server: str | None, timeout_s: float) -> Any:
    """The flags' ``RemoteSpec`` (None without --rpc/--rpc-server); UserError for a combination that cannot work."""
    from amptool.runtime.remote import RemoteSpec, parse_address  # noqa: PLC0415

    if tracker and server:
        raise UserError("--rpc and --rpc-server both name a remote", "Use --rpc HOST:PORT --rpc-key KEY for a "
                        "tracker, or --rpc-server HOST:PORT for one server.")
    if tracker and not key:
        raise UserError(f"--rpc {tracker} needs --rpc-key: the tracker hands out devices by key",
                        "'python -m tvm.exec.query_rpc_tracker --host HOST --port PORT' lists the keys.")
    if key is not None and not tracker:
        raise UserError("--rpc-key is only used with --rpc HOST:PORT (a tracker)",
                        "Add --rpc HOST:PORT, or drop --rpc-key for --rpc-server.")
    if not tracker and not server:
        return None
    flag, address = ("--rpc", tracker) if tracker else ("--rpc-server", server)
    host, port = parse_address(str(address), flag)
    return RemoteSpec(host, port, key if tracker else None, timeout_s)
