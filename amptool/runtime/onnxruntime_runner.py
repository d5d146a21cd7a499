"""Every onnxruntime session amptool opens: the fp32 reference, calibration and per-layer
probes (every tensor exposed), prepare's folding and checks, and bench's worker.

One owner (:func:`session`) for the options — optimisation level, threads, providers, log level,
a large model's initializers passed as arrays rather than serialised (``APART_MODEL_BYTES``) —
so a change to how amptool talks to onnxruntime is made once.

onnxruntime's Python API takes and gives numpy arrays only of numpy's own types. bfloat16 and
float8 inputs (ml_dtypes arrays) are passed as ``OrtValue``s built from their bits. Outputs of
those types, and int4/uint4, cannot come back ("No corresponding Numpy type for Tensor Type"),
so each is read through a Cast to float32 (int8/uint8 for int4/uint4) appended to the graph —
exact, every such value is representable — and returned as the ml_dtypes array of its type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import onnx

from amptool.dtypes import SMALL_INT_CONTAINERS, as_container, is_ml_dtype
from amptool.errors import UserError

_HINT = "Pass --reference-outputs with stored outputs, or fix the model for onnxruntime."

_T = onnx.TensorProto
#: Output types onnxruntime cannot return to numpy → the type they are read through.
_READ_AS = {
    _T.BFLOAT16: _T.FLOAT,
    _T.FLOAT8E4M3FN: _T.FLOAT,
    _T.FLOAT8E4M3FNUZ: _T.FLOAT,
    _T.FLOAT8E5M2: _T.FLOAT,
    _T.FLOAT8E5M2FNUZ: _T.FLOAT,
}
#: Input types fed in an 8-bit container and cast inside the model (numpy holds one value a byte);
#: outputs of those types are read through the same container.
_FEED_AS = {getattr(_T, small.upper()): getattr(_T, container.upper())
            for small, container in SMALL_INT_CONTAINERS.items()}
_READ_AS.update(_FEED_AS)
_SUFFIX = "__amptool_read"


#: Graph optimisation levels by name: "disable" keeps every tensor a probe asks for, "basic"
#: folds constants (prepare), "all" is what a user's session gets (bench).
_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "all": "ORT_ENABLE_ALL"}


class Apart(NamedTuple):
    """A model as a session takes it without copying its weights (``split_apart``): serialised with its
    large initializers as stubs, and their names and arrays. Immutable: a thread may open it while the
    ModelProto it came from changes."""

    light: bytes
    names: list[str]
    arrays: list[np.ndarray]


def session(model: onnx.ModelProto | Apart | str | bytes, *, optimize: str = "all", threads: int | None = None,
            providers: Sequence[str] = ("CPUExecutionProvider",), save_optimized: str | None = None,
            session_config: Mapping[str, str] | None = None, outputs: Sequence[str] = (),
            one_shot: bool = False) -> Any:
    """An ``onnxruntime.InferenceSession`` on ``model`` (a ModelProto, an ``Apart``, a path or serialised
    bytes), with ``outputs`` added as graph outputs (not to a path). ``one_shot``: a session run once or
    twice (prepare's checks, calibration's probe), which skips onnxruntime's weight prepacking — a
    copy of every MatMul weight in its own layout, there only to speed up later runs (BERT-base:
    0.5 s and 440 MB a session). Raises what onnxruntime raises: callers decide whether that is a user
    error, a skipped step or a refusal."""
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.log_severity_level = 4  # failures are raised and reported once, by the caller
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[optimize])
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if save_optimized is not None:
        options.optimized_model_filepath = save_optimized
    for key, value in {**(session_config or {}), **({"session.disable_prepacking": "1"} if one_shot else {})}.items():
        options.add_session_config_entry(key, value)
    providers = list(dict.fromkeys([*providers, "CPUExecutionProvider"]))
    if isinstance(model, str):
        if outputs:
            raise ValueError("outputs cannot be added to a model given by path")
        return ort.InferenceSession(model, options, providers=providers)
    if isinstance(model, bytes):
        return ort.InferenceSession(with_outputs(model, outputs), options, providers=providers)
    apart = model if isinstance(model, Apart) else split_apart(model) if save_optimized is None else None
    if apart is None:
        assert isinstance(model, onnx.ModelProto)
        return ort.InferenceSession(with_outputs(model.SerializeToString(), outputs), options, providers=providers)
    values = [ort.OrtValue.ortvalue_from_numpy(array) for array in apart.arrays]
    options.add_external_initializers(apart.names, values)
    handle = ort.InferenceSession(with_outputs(apart.light, outputs), options, providers=providers)
    handle.amptool_initializers = values  # onnxruntime reads them in place: they live as long as the session
    return handle


#: A model with at least this many bytes of initializers passes the large ones (``APART_TENSOR_BYTES``
#: and up) to onnxruntime as arrays beside a model that holds only their names, shapes and types.
#: Why: serialising the model and onnxruntime parsing and copying it again cost BERT-base (437 MB)
#: 2.4-3.8 s per session, given apart 0.8-1.8 s; ResNet-50 0.5-0.7 → 0.2-0.3 s (outputs identical).
#: Small tensors stay in the model: shape inference reads them (axes, shapes).
APART_MODEL_BYTES = 16 << 20
APART_TENSOR_BYTES = 64 << 10
_APART_TYPES = frozenset({_T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.INT8, _T.INT16, _T.INT32, _T.INT64,
                          _T.UINT8, _T.UINT16, _T.UINT32, _T.UINT64, _T.BOOL})


def split_apart(model: onnx.ModelProto) -> Apart | None:
    """``model`` with its large initializers apart (``Apart``), or None for a model too small to gain
    from it. The arrays are copies: the model may change afterwards."""
    from onnx import numpy_helper  # noqa: PLC0415

    from amptool.frontend.fold import stubbed_copy  # noqa: PLC0415
    from amptool.frontend.graph import iter_nodes  # noqa: PLC0415

    graph = model.graph
    sizes = {init.name: _nbytes(init) for init in graph.initializer
             if init.data_type in _APART_TYPES and init.data_location != _T.EXTERNAL}
    large = [init for init in graph.initializer if sizes.get(init.name, 0) >= APART_TENSOR_BYTES]
    if sum(sizes[init.name] for init in large) < APART_MODEL_BYTES:
        return None
    # onnxruntime drops an initializer nothing reads before it takes the arrays, then fails to find it
    # ("ReplaceInitializedTensorImpl Failed to find existing initializer"): such ones are left out.
    read = {name for node in iter_nodes(graph) for name in node.input}
    read.update(value.name for value in [*graph.output, *graph.input])
    unread = {init.name for init in graph.initializer if init.name not in read}
    large = [init for init in large if init.name not in unread]
    light = stubbed_copy(model, {init.name for init in large}, "amptool-initializers-passed-apart", unread)
    return Apart(light.SerializeToString(), [init.name for init in large],
                 [numpy_helper.to_array(init) for init in large])


def _nbytes(tensor: onnx.TensorProto) -> int:
    """The bytes of ``tensor``'s data, from its shape and type (reading ``raw_data`` copies it)."""
    return int(np.prod(tensor.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def run_session(handle: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Output name → value, feeding only the inputs the session takes."""
    wanted = {i.name for i in handle.get_inputs()}
    names = [o.name for o in handle.get_outputs()]
    return dict(zip(names, handle.run(None, {k: v for k, v in feeds.items() if k in wanted}), strict=True))


def every_tensor(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Every main-graph tensor of ``model`` that is computed at run time (not an initializer or a
    Constant's output), from one unoptimised run: calibration and per-layer comparison read these."""
    # unoptimised: optimising would fuse them away
    handle = session(model, optimize="disable", outputs=exposable_tensors(model), one_shot=True)
    return run_session(handle, feeds)


def exposable_tensors(model: onnx.ModelProto) -> list[str]:
    """The main-graph tensors ``every_tensor`` adds as outputs: computed at run time, not yet outputs."""
    graph = model.graph
    constants = {init.name for init in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    present = {o.name for o in graph.output}
    return list(dict.fromkeys(t for n in graph.node for t in n.output if t and t not in present and t not in constants))


def with_outputs(serialized: bytes, names: Sequence[str]) -> bytes:
    """A serialised ModelProto with ``names`` added as graph outputs, without copying or serialising
    the model again: protobuf merges a message field that occurs twice and appends its repeated
    fields, so the outputs follow as a second, small ``graph``. (A copy of a ResNet-50 and its
    serialisation took 0.2 s of a calibration, measured.)"""
    if not names:
        return serialized
    extra = onnx.ModelProto(graph=onnx.GraphProto(output=[onnx.ValueInfoProto(name=name) for name in names]))
    return serialized + extra.SerializeToString()


class OnnxruntimeRunner:
    """One onnxruntime CPU session, reused for every input set (``diff --iterations``)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        model, self._read = _readable_outputs(_feedable_inputs(model))
        try:
            self._session: Any = session(model)
        except Exception as err:
            raise _user_error(err) from err
        copies = {copy for copy, _ in self._read.values()}
        self.output_names = [o.name for o in self._session.get_outputs() if o.name not in copies]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Output name → array. Raises UserError when onnxruntime cannot run the model."""
        fetch = [self._read[n][0] if n in self._read else n for n in self.output_names]
        try:
            outputs = self._session.run(fetch, {name: _feed(array) for name, array in feeds.items()})
        except Exception as err:
            raise _user_error(err) from err
        result = {}
        for name, value in zip(self.output_names, outputs):
            array = np.asarray(value)
            result[name] = array.astype(self._read[name][1]) if name in self._read else array
        return result


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Output name → array, from a fresh session. Raises UserError when onnxruntime cannot run the model."""
    return OnnxruntimeRunner(model).run(feeds)


def _feed(array: np.ndarray) -> Any:
    """``array``, or an OrtValue of its bits for ml_dtypes' bfloat16/float8; int4/uint4/int2/uint2
    as their int8/uint8 container (``_feedable_inputs``)."""
    array = as_container(array)
    if not is_ml_dtype(array.dtype) or array.dtype.itemsize not in (1, 2):
        return array
    import onnxruntime as ort  # noqa: PLC0415

    elem_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    bits = np.ascontiguousarray(array).view(np.uint8 if array.dtype.itemsize == 1 else np.uint16)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, elem_type)


def _feedable_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` taking each int4/uint4/int2/uint2 input in its int8/uint8 container, cast to the narrow
    type inside: onnxruntime packs two int4 values a byte, numpy (ml_dtypes) keeps one, so a fed int4
    array was read as other values. ``model`` itself when it has no such input."""
    weights = {init.name for init in model.graph.initializer}
    narrow = [v for v in model.graph.input if v.type.tensor_type.elem_type in _FEED_AS and v.name not in weights]
    if not narrow:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    renamed = {v.name: f"{v.name}{_SUFFIX}" for v in narrow}
    for node in graph.node:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
    for output in graph.output:
        if output.name in renamed:  # an input returned as it is: returned in its container too
            output.type.tensor_type.elem_type = _FEED_AS[output.type.tensor_type.elem_type]
    casts = []
    for value in graph.input:
        if value.name in renamed:
            elem_type = value.type.tensor_type.elem_type
            value.type.tensor_type.elem_type = _FEED_AS[elem_type]
            casts.append(onnx.helper.make_node("Cast", [value.name], [renamed[value.name]], to=elem_type))
    nodes = [*casts, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return copy


def _readable_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, tuple[str, np.dtype]]]:
    """``model`` with a readable copy of every output numpy cannot take, and output name →
    (copy's name, the dtype to give the values back in)."""
    unreadable = [o for o in model.graph.output if o.type.tensor_type.elem_type in _READ_AS]
    if not unreadable:
        return model, {}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    read: dict[str, tuple[str, np.dtype]] = {}
    for output in unreadable:
        elem_type = output.type.tensor_type.elem_type
        name = f"{output.name}{_SUFFIX}"
        copy.graph.node.append(onnx.helper.make_node("Cast", [output.name], [name], name=name, to=_READ_AS[elem_type]))
        copy.graph.output.append(onnx.helper.make_tensor_value_info(name, _READ_AS[elem_type], None))
        read[output.name] = (name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    return copy, read


def _user_error(err: Exception) -> UserError:
    text = str(err).strip().splitlines()
    return UserError(f"onnxruntime cannot run the reference model: {text[0][:300] if text else err!r}", _HINT)
