"""Model inputs/outputs: names, dtypes and shapes, with every dynamic dim pinned.

TVM compiles static shapes best, and onnxruntime's constant folding of shape chains needs
them, so amptool pins every input dim before import: from ``--input-shape``, from the
arrays given with ``--inputs``, or from the model's declared static dims. A dim that is
still unknown stops the run with a line naming the input and how to pin it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from amptool.dtypes import numpy_dtype
from amptool.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output. ``shape`` entries are ints, or str for symbolic dims."""

    name: str
    dtype: str
    shape: tuple[int | str, ...] | None

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) and d > 0 for d in self.shape)

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape or [])}


def _dtype_name(elem_type: int) -> str:
    if elem_type == onnx.TensorProto.UNDEFINED:
        return "undefined"
    return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    ttype = value.type.tensor_type
    shape: tuple[int | str, ...] | None = None
    if ttype.HasField("shape"):
        dims: list[int | str] = []
        for dim in ttype.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                dims.append(int(dim.dim_value))
            else:
                dims.append(dim.dim_param or "?")
        shape = tuple(dims)
    return TensorSpec(value.name, _dtype_name(ttype.elem_type), shape)


def graph_inputs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Real inputs: graph inputs that are not backed by an initializer (those are weights)."""
    weights = {init.name for init in model.graph.initializer}
    return [_spec(v) for v in model.graph.input if v.name not in weights]


def graph_outputs(model: onnx.ModelProto) -> list[TensorSpec]:
    return [_spec(v) for v in model.graph.output]


_SHAPE_RE = re.compile(r"^\s*(\d+(?:\s*[x,×]\s*\d+)*)?\s*$")


def parse_input_shapes(values: Sequence[str], input_names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME:1x3x224x224`` (or a bare ``1x3x224x224`` when the model has one input)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for raw in values:
        name, sep, dims_text = raw.rpartition(":")
        if not sep:
            if len(input_names) != 1:
                raise UserError(
                    f"--input-shape '{raw}' names no input and the model has "
                    f"{len(input_names)} inputs",
                    f"Write NAME:DIMS, e.g. {input_names[0] if input_names else 'input'}:1x3x224x224.",
                )
            name = input_names[0]
        if not _SHAPE_RE.match(dims_text):
            raise UserError(
                f"--input-shape '{raw}': '{dims_text}' is not a shape",
                "Write dims as positive integers separated by 'x', e.g. 1x3x224x224 ('' for a scalar).",
            )
        if name not in input_names:
            raise UserError(
                f"--input-shape names unknown input '{name}'",
                f"Model inputs: {', '.join(input_names) or '(none)'}.",
            )
        dims = tuple(int(d) for d in re.split(r"\s*[x,×]\s*", dims_text.strip()) if d)
        if any(d <= 0 for d in dims):
            raise UserError(f"--input-shape '{raw}': dims must be positive")
        shapes[name] = dims
    return shapes


#: Most bytes the model inputs of one run may take together (``--max-input-size``): a declared
#: 1x3x100000x100000 input would otherwise ask for 224 GiB before anything could say no.
DEFAULT_MAX_INPUT_BYTES = 4 << 30


def pin_input_specs(
    inputs: Sequence[TensorSpec],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    arrays: Mapping[str, np.ndarray] | None = None,
    max_bytes: int = DEFAULT_MAX_INPUT_BYTES,
) -> list[TensorSpec]:
    """Resolve every input to a static shape, or raise a UserError naming what to pin; refuse
    inputs that together exceed ``max_bytes`` before anything allocates them."""
    shapes = dict(shapes or {})
    arrays = dict(arrays or {})
    pinned: list[TensorSpec] = []
    for spec in inputs:
        if spec.name in shapes:
            shape: tuple[int | str, ...] | None = shapes[spec.name]
        elif spec.name in arrays:
            shape = tuple(int(d) for d in np.shape(arrays[spec.name]))
        else:
            shape = spec.shape
        if spec.shape is not None and shape is not None and len(shape) != len(spec.shape):
            raise UserError(
                f"Input '{spec.name}' has rank {len(spec.shape)} in the model but the given "
                f"shape {list(shape)} has rank {len(shape)}",
                f"Give {len(spec.shape)} dims for '{spec.name}'.",
            )
        if spec.shape is not None and shape is not None:
            for declared, given in zip(spec.shape, shape):
                if isinstance(declared, int) and declared != given:
                    raise UserError(
                        f"Input '{spec.name}' is declared {_fmt(spec.shape)} but was given "
                        f"{_fmt(shape)}",
                        "Static dims of the model cannot be changed; pin only the dynamic ones.",
                    )
        candidate = TensorSpec(spec.name, spec.dtype, shape)
        if not candidate.is_static and _only_batch_dynamic(shape):
            candidate = TensorSpec(spec.name, spec.dtype, (1, *shape[1:]))  # type: ignore[index]
            log.warning("input '%s' %s: dynamic batch dim pinned to 1 (choose with --input-shape %s:%s)",
                        spec.name, _fmt(spec.shape), spec.name, _example(spec.shape))
        if not candidate.is_static:
            raise UserError(
                f"Input '{spec.name}' has unknown dims {_fmt(spec.shape)}",
                f"Pin them with --input-shape {spec.name}:{_example(spec.shape)} "
                "or pass --inputs with arrays.",
            )
        pinned.append(candidate)
    check_input_bytes(pinned, max_bytes)
    return pinned


def input_bytes(spec: TensorSpec) -> int:
    """Bytes one array of ``spec`` takes (exact integers: 2^62-element dims do not overflow)."""
    count = 1
    for dim in spec.shape or ():
        count *= int(dim)
    try:
        itemsize = numpy_dtype(spec.dtype).itemsize
    except TypeError:
        itemsize = 8
    return count * itemsize


def check_input_bytes(specs: Sequence[TensorSpec], max_bytes: int) -> None:
    """UserError when the inputs of one run would take more than ``max_bytes``."""
    sizes = {spec.name: input_bytes(spec) for spec in specs}
    total = sum(sizes.values())
    if total > max_bytes:
        name = max(sizes, key=lambda n: sizes[n])
        shape = next(s.shape for s in specs if s.name == name)
        raise UserError(
            f"Inputs would take {_bytes_text(total)} (input '{name}' {_fmt(shape)}: {_bytes_text(sizes[name])}), "
            f"over the {_bytes_text(max_bytes)} limit",
            f"Pin smaller shapes with --input-shape {name}:…, or raise the limit with --max-input-size.",
        )


def _bytes_text(count: int) -> str:
    for unit, scale in (("EiB", 1 << 60), ("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _fmt(shape: tuple[int | str, ...] | None) -> str:
    if shape is None:
        return "(unknown rank)"
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _example(shape: tuple[int | str, ...] | None) -> str:
    if shape is None:
        return "1x3x224x224"
    return "x".join(str(d) if isinstance(d, int) else "1" for d in shape) or "''"


def parse_fixed_inputs(values: Sequence[str], inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Parse ``NAME=VALUE`` (``sr=16000``, ``flags=1,0,1``) into arrays of the input's dtype.

    A fixed input becomes a constant of the converted model. Why: control flow that reads an
    input's *value* (silero-vad's ``If(sr == 16000)``) makes both branches part of the import,
    and the branch not meant for the pinned shapes may not even be well-typed; with the value
    fixed, the condition folds and only the live branch is imported.
    """
    by_name = {s.name: s for s in inputs}
    fixed: dict[str, np.ndarray] = {}
    for raw in values:
        name, sep, text = raw.partition("=")
        name = name.strip()
        if not sep or not text.strip():
            raise UserError(f"--fixed-input '{raw}' is not NAME=VALUE", "Write e.g. --fixed-input sr=16000.")
        spec = by_name.get(name)
        if spec is None:
            raise UserError(
                f"--fixed-input names unknown input '{name}'",
                f"Model inputs: {', '.join(by_name) or '(none)'}.",
            )
        try:
            items = [float(t) if spec.dtype.startswith(("float", "bfloat")) else _int_or_bool(t)
                     for t in text.split(",")]
            array = np.array(items if len(items) > 1 else items[0], dtype=numpy_dtype(spec.dtype))
        except (ValueError, TypeError) as err:
            raise UserError(
                f"--fixed-input '{raw}': '{text}' is not a {spec.dtype} value ({err})",
                "Give a number, or comma-separated numbers for a 1-D input.",
            ) from err
        if spec.shape is not None and array.ndim != len(spec.shape):
            array = _fill_shape(raw, spec, array)
        fixed[name] = array
    return fixed


def _only_batch_dynamic(shape: Sequence[int | str] | None) -> bool:
    """A leading dynamic dim on a rank ≥ 2 input whose other dims are static: the batch of
    nearly every export (``dynamic_axes={"input": {0: "batch"}}``). One is always valid there;
    a dynamic length or spatial dim has no such safe default and must be pinned."""
    return (shape is not None and len(shape) >= 2 and not isinstance(shape[0], int)
            and all(isinstance(d, int) for d in shape[1:]))


def _fill_shape(raw: str, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """A fixed value for an N-D input of static shape: one value fills it, or exactly as many
    values as it has elements fill it in row-major order (``mask=1`` for a [2, 8] mask)."""
    if spec.is_static:
        shape = tuple(int(d) for d in spec.shape or ())
        count = int(np.prod(shape))
        if array.size == 1:
            return np.full(shape, array.reshape(()), dtype=array.dtype)
        if array.size == count:
            return array.reshape(shape)
        want = "1 value" if count == 1 else f"1 or {count} values"
    else:
        want = "a static shape (pin it with --input-shape)"
    raise UserError(
        f"--fixed-input '{raw}' gives {array.size} value(s) but '{spec.name}' has shape "
        f"[{', '.join(str(d) for d in spec.shape or ())}]: needs {want}",
        "Give one value to fill it, or every element in row-major order; or pass the array with --inputs.",
    )


def _int_or_bool(text: str) -> int:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    return int(text)
