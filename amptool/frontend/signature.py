"""Model inputs/outputs: names, dtypes and shapes, with every dynamic dim pinned.

TVM compiles static shapes best, and onnxruntime's constant folding of shape chains needs
them, so amptool pins every input dim before import: from ``--input-shape``, from the
arrays given with ``--inputs``, or from the model's declared static dims. A dim that is
still unknown stops the run with a line naming the input and how to pin it.
"""

from __future__ import annotations

import logging
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
        return self.shape is not None and all(isinstance(d, int) and d >= 0 for d in self.shape)

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape or [])}


#: Element types no backend here can hold → what to feed instead (inputs).
_REFUSED: dict[int, str] = {
    onnx.TensorProto.COMPLEX64: "TVM has no complex tensors; pass real and imaginary parts as two float tensors.",
    onnx.TensorProto.COMPLEX128: "TVM has no complex tensors; pass real and imaginary parts as two float tensors.",
    onnx.TensorProto.STRING: "Move string pre/post-processing out of the model.",
    **{code: "TVM cannot hold this type; take int8/uint8, float16 or float32 and Cast inside the model."
       for code in (getattr(onnx.TensorProto, name, None)
                    for name in ("FLOAT4E2M1", "FLOAT8E8M0", "FLOAT6E2M3", "FLOAT6E3M2"))
       if code is not None},
}


def _dtype_name(elem_type: int, role: str, name: str) -> str:
    """The numpy name of an ONNX element type ('float32', 'bfloat16', 'float8_e4m3fn', …);
    a UserError naming the tensor for a type amptool cannot handle or does not know."""
    if elem_type == onnx.TensorProto.UNDEFINED:
        if role == "Input":
            raise UserError(f"Input '{name}' declares no element type", "Re-export the model with typed inputs.")
        return "undefined"
    try:
        type_name = onnx.TensorProto.DataType.Name(elem_type)
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, ValueError, TypeError) as err:
        raise UserError(
            f"{role} '{name}' has element type {elem_type}, which is not an ONNX tensor type (onnx {onnx.__version__})",
            "The file is damaged, or from a newer ONNX than this one: re-export it, or upgrade onnx.",
        ) from err
    if elem_type in _REFUSED:  # int4/uint4/int2/uint2 are not: carried in int8/uint8 (narrow_casts)
        hint = _REFUSED[elem_type] if role == "Input" else "Cast it to float32 (or float16) before the output."
        raise UserError(f"{role} '{name}' is {type_name} ({dtype}), which amptool cannot convert", hint)
    return dtype


def _spec(value: onnx.ValueInfoProto, role: str) -> TensorSpec:
    ttype = value.type.tensor_type
    shape: tuple[int | str, ...] | None = None
    if ttype.HasField("shape"):
        dims: list[int | str] = []
        for dim in ttype.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value >= 0:  # 0: a static empty dim, not an unknown one
                dims.append(int(dim.dim_value))
            else:
                dims.append(dim.dim_param or "?")
        shape = tuple(dims)
    return TensorSpec(value.name, _dtype_name(ttype.elem_type, role, value.name), shape)


def graph_inputs(model: onnx.ModelProto) -> list[TensorSpec]:
    """Real inputs: graph inputs that are not backed by an initializer (those are weights)."""
    weights = {init.name for init in model.graph.initializer}
    real = [v for v in model.graph.input if v.name not in weights]
    for value in real:
        kind = value.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):  # a sequence/map/optional: the compiled module takes tensors only
            raise UserError(f"Input '{value.name}' is {_kind_name(kind)}, which amptool cannot convert",
                            "Make every model input a tensor (e.g. feed a stacked tensor and split it in the model).")
    return [_spec(v, "Input") for v in real]


def _kind_name(kind: str) -> str:
    """'a sequence', 'an optional', 'a map' for a TypeProto's ``value`` field name."""
    word = kind.removesuffix("_type")
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def graph_outputs(model: onnx.ModelProto) -> list[TensorSpec]:
    """The graph outputs; int4/uint4 ones come back from TVM in int8/uint8 (see narrow_casts)."""
    for value in model.graph.output:
        kind = value.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):  # a sequence/map/optional: the compiled module returns tensors only
            raise UserError(f"Output '{value.name}' is {_kind_name(kind)}, which amptool cannot convert",
                            "Make every model output a tensor (e.g. ConcatFromSequence before the output).")
    return [_spec(v, "Output") for v in model.graph.output]


#: Most bytes the model inputs of one run may take together (``--max-input-size``): a declared
#: 1x3x100000x100000 input would otherwise ask for 224 GiB before anything could say no.
DEFAULT_MAX_INPUT_BYTES = 4 << 30


def pin_input_specs(
    inputs: Sequence[TensorSpec],
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    arrays: Mapping[str, np.ndarray] | None = None,
    max_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    dims: Mapping[str, int] | None = None,
) -> list[TensorSpec]:
    """Resolve every input to a static shape, or raise a UserError naming what to pin; refuse
    inputs that together exceed ``max_bytes`` before anything allocates them. ``dims`` sets
    symbolic dims by name in every input (``--dim batch=8``); an explicit shape or array wins."""
    shapes = dict(shapes or {})
    arrays = dict(arrays or {})
    named = substitute_dims(inputs, dims or {})
    pinned: list[TensorSpec] = []
    for spec, with_dims in zip(inputs, named):
        if spec.name in shapes:
            shape: tuple[int | str, ...] | None = shapes[spec.name]
        elif spec.name in arrays:
            shape = tuple(int(d) for d in np.shape(arrays[spec.name]))
        else:
            shape = with_dims
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
            dim_names = dict.fromkeys(d for d in (spec.shape or ()) if isinstance(d, str) and d)
            by_name = " ".join(f"--dim {d}=N" for d in dim_names)
            raise UserError(
                f"Input '{spec.name}' has unknown dims {_fmt(spec.shape)}",
                (f"Pin them with {by_name} (every input that declares it), " if dim_names else "Pin them with ")
                + f"--input-shape {spec.name}:{_example(spec.shape)} (each N the size you run) "
                "or pass --inputs with arrays.",
            )
        pinned.append(candidate)
    check_input_bytes(pinned, max_bytes)
    return pinned


def symbolic_dims(inputs: Sequence[TensorSpec]) -> list[str]:
    """The names of the symbolic dims (dim_param) the inputs declare, in order of first use."""
    names: dict[str, None] = {}
    for spec in inputs:
        for dim in spec.shape or ():
            if isinstance(dim, str) and dim != "?":
                names.setdefault(dim)
    return list(names)


def substitute_dims(inputs: Sequence[TensorSpec], dims: Mapping[str, int]) -> list[tuple[int | str, ...] | None]:
    """Each input's declared shape with the named symbolic dims replaced by their values;
    a UserError for a name no input declares (a typo would otherwise pin nothing)."""
    declared = symbolic_dims(inputs)
    unknown = [name for name in dims if name not in declared]
    if unknown:
        raise UserError(f"--dim names unknown symbolic dim(s) {', '.join(repr(n) for n in unknown)}",
                        f"The model's inputs declare: {', '.join(declared) or 'no symbolic dims'}.")
    return [None if spec.shape is None else tuple(dims.get(d, d) if isinstance(d, str) else d for d in spec.shape)
            for spec in inputs]


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
    """An --input-shape value for ``shape``: its static dims, 1 for a dynamic batch (the first dim
    of a rank ≥ 2 input), ``N`` for any other dynamic dim — a sequence length or an image side has
    no safe default, and 1 there (a one-token sequence) was a runnable hint that misled."""
    if shape is None:
        return "1x3x224x224"
    dims = [str(d) if isinstance(d, int) else "1" if i == 0 and len(shape) >= 2 else "N" for i, d in enumerate(shape)]
    return "x".join(dims) or "''"


def _only_batch_dynamic(shape: Sequence[int | str] | None) -> bool:
    """A leading dynamic dim on a rank ≥ 2 input whose other dims are static: the batch of
    nearly every export (``dynamic_axes={"input": {0: "batch"}}``). One is always valid there;
    a dynamic length or spatial dim has no such safe default and must be pinned."""
    return (shape is not None and len(shape) >= 2 and not isinstance(shape[0], int)
            and all(isinstance(d, int) for d in shape[1:]))
