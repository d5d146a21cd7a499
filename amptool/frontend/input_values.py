"""Input shapes and fixed input values: parsed once from text at the edge, resolved against the model here.

The CLI turns ``--input-shape NAME:1x3x224x224`` and ``--fixed-input NAME=VALUE`` into typed values
with :func:`parse_input_shape` and :func:`parse_fixed_input`; the Python API takes the same values
directly (``{"x": (1, 3, 224, 224)}``, ``{"sr": 16000}``). Nothing below re-reads CLI text: the
library only checks the typed values against the model (:func:`resolve_input_shapes`,
:func:`fixed_input_arrays`) and formats them back for messages (:func:`shape_text`).

A fixed input becomes a constant of the converted model. Why: control flow that reads an input's
*value* (silero-vad's ``If(sr == 16000)``) makes both branches part of the import, and the branch
not meant for the pinned shapes may not even be well-typed; with the value fixed, the condition
folds and only the live branch is imported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from amptool.dtypes import numpy_dtype
from amptool.errors import UserError
from amptool.frontend.signature import TensorSpec

#: Key of an ``--input-shape`` given without a name: the model's only input.
ONLY_INPUT = ""
_DIMS = re.compile(r"^\s*(\d+(?:\s*[x,×]\s*\d+)*)?\s*$")
Number = bool | int | float
FixedValue = Number | Sequence[Number] | np.ndarray


def parse_input_shape(raw: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:1x3x224x224`` (or Polygraphy's ``NAME:[1,3,224,224]``) → (NAME, dims); a bare
    ``1x3x224x224`` → (:data:`ONLY_INPUT`, dims)."""
    name, sep, dims_text = raw.rpartition(":")
    if sep and not name.strip():
        raise UserError(f"--input-shape '{raw}' names no input before ':'",
                        "Write NAME:DIMS, e.g. --input-shape images:1x3x224x224 (or DIMS alone for a one-input model).")
    dims_text = dims_text.strip().removeprefix("[").removesuffix("]")
    if not _DIMS.match(dims_text):
        raise UserError(f"--input-shape '{raw}': '{dims_text}' is not a shape",
                        "Write dims as positive integers separated by 'x', e.g. 1x3x224x224 ('' for a scalar).")
    dims = tuple(int(d) for d in re.split(r"\s*[x,×]\s*", dims_text.strip()) if d)
    if any(d <= 0 for d in dims):
        raise UserError(f"--input-shape '{raw}': dims must be positive",
                        "amptool compiles for one shape; a zero-size input has nothing to convert.")
    return (name if sep else ONLY_INPUT), dims


def parse_input_shapes(texts: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Every ``--input-shape`` by input name; one input given twice is refused (the last would win)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, dims = parse_input_shape(text)
        if name in shapes and shapes[name] != dims:
            label = "the model's input" if name == ONLY_INPUT else f"'{name}'"
            raise UserError(f"--input-shape gives {label} twice ({shape_text(shapes[name])} and {shape_text(dims)})",
                            "Give each input one shape.")
        shapes[name] = dims
    return shapes


def parse_dim(raw: str) -> tuple[str, int]:
    """``batch=8`` → ("batch", 8): a value for the symbolic dim ``batch`` (``--dim``), like
    onnxruntime's free dimension override."""
    name, sep, text = raw.partition("=")
    name = name.strip()
    try:
        value = int(text.strip()) if sep and name else 0
    except ValueError:
        value = 0
    if value <= 0:
        raise UserError(f"--dim '{raw}' is not NAME=VALUE with a positive integer VALUE",
                        "Write e.g. --dim batch=8 --dim seq_len=128.")
    return name, value


def shape_text(dims: Sequence[int | str] | None) -> str:
    return "x".join(str(d) for d in dims or ())


def resolve_input_shapes(shapes: Mapping[str, Sequence[int]], input_names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The shapes by input name, checked against the model (the unnamed one names its only input)."""
    resolved: dict[str, tuple[int, ...]] = {}
    for name, dims in shapes.items():
        if name == ONLY_INPUT:
            if len(input_names) != 1:
                raise UserError(
                    f"--input-shape {shape_text(dims)} names no input and the model has {len(input_names)} inputs",
                    f"Write NAME:DIMS, e.g. {input_names[0] if input_names else 'input'}:1x3x224x224.",
                )
            name = input_names[0]
        if name not in input_names:
            raise UserError(f"--input-shape names unknown input '{name}'",
                            f"Model inputs: {', '.join(input_names) or '(none)'}.")
        try:
            resolved[name] = tuple(int(d) for d in dims)
        except (TypeError, ValueError) as err:
            raise UserError(f"input shape of '{name}' is {dims!r}, not a sequence of ints") from err
        if any(d <= 0 for d in resolved[name]):
            raise UserError(f"--input-shape {name}:{shape_text(dims)}: dims must be positive")
    return resolved


def parse_fixed_input(raw: str) -> tuple[str, FixedValue]:
    """``sr=16000`` → ("sr", 16000); ``flags=1,0,1`` → ("flags", (1, 0, 1)); ``true``/``false`` are bools."""
    name, sep, text = raw.partition("=")
    name = name.strip()
    if not sep or not name or not text.strip():
        raise UserError(f"--fixed-input '{raw}' is not NAME=VALUE", "Write e.g. --fixed-input sr=16000.")
    try:
        items = tuple(_number(token) for token in text.split(","))
    except ValueError as err:
        raise UserError(f"--fixed-input '{raw}': '{text}' is not a number or a list of numbers",
                        "Give a number, or comma-separated numbers for a 1-D input.") from err
    return name, items if len(items) > 1 else items[0]


def _number(token: str) -> Number:
    text = token.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return float(text)


def fixed_input_arrays(values: Mapping[str, FixedValue], inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    """Each fixed value as an array of its input's dtype and shape (one value fills a static N-D input)."""
    by_name = {s.name: s for s in inputs}
    fixed: dict[str, np.ndarray] = {}
    for name, value in values.items():
        spec = by_name.get(name)
        if spec is None:
            raise UserError(f"--fixed-input names unknown input '{name}'",
                            f"Model inputs: {', '.join(by_name) or '(none)'}.")
        array = _typed(name, value, spec)
        if spec.shape is not None and array.ndim != len(spec.shape):
            array = _fill_shape(name, value, spec, array)
        fixed[name] = array
    return fixed


def _typed(name: str, value: FixedValue, spec: TensorSpec) -> np.ndarray:
    """``value`` in the input's dtype; a fraction for an integer input is refused, not truncated."""
    given = np.asarray(value)
    dtype = numpy_dtype(spec.dtype)
    if given.dtype.kind not in "biuf":
        raise UserError(f"--fixed-input {name}: {value!r} is not numeric")
    if dtype.kind in "biu" and given.dtype.kind == "f" and not np.all(np.equal(np.mod(given, 1), 0)):
        raise UserError(f"--fixed-input {name}={value_text(value)} is not a {spec.dtype} value",
                        "Give whole numbers for an integer input.")
    try:
        return given.astype(dtype)
    except (ValueError, TypeError, OverflowError) as err:
        raise UserError(f"--fixed-input {name}={value_text(value)} is not a {spec.dtype} value ({err})") from err


def value_text(value: FixedValue) -> str:
    return ",".join(str(v) for v in np.asarray(value).ravel().tolist())


def _fill_shape(name: str, value: FixedValue, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
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
        f"--fixed-input {name}={value_text(value)} gives {array.size} value(s) but '{spec.name}' has shape "
        f"[{', '.join(str(d) for d in spec.shape or ())}]: needs {want}",
        "Give one value to fill it, or every element in row-major order; or pass the array with --inputs.",
    )
