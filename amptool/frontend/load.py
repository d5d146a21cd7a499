"""Load and validate an ONNX model before anything expensive happens.

Why a stage of its own: every later stage (onnxruntime reference, Relax import, per-node
colour overrides) needs the same, checked model with every node named. Models exported
without node names get deterministic ``<OpType>_<index>`` names here, once, so provenance,
colour overrides and reports all speak the same names.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import logging
import os
import threading
from dataclasses import dataclass, field

import onnx

from amptool.errors import UserError, error_summary
from amptool.fileio import check_regular_file, physical_memory
from amptool.frontend.graph import default_opset, iter_nodes

#: Ops that mean the model is already quantized: amptool converts float models.
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "ConvInteger",
        "MatMulInteger",
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearSoftmax",
        "QAttention",
        "QGemm",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "MatMulNBits",
    }
)


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A checked model plus where it came from."""

    model: onnx.ModelProto
    path: str
    opset: int
    digest: concurrent.futures.Future[str] = field(compare=False, repr=False)

    def sha256(self) -> str:
        """The model file's SHA-256 (the manifest's ``model.sha256``), of the bytes load read."""
        return self.digest.result()


def _sha256_in_background(data: bytes) -> concurrent.futures.Future[str]:
    """The SHA-256 of ``data``, computed in a thread of its own: hashlib releases the GIL, so a
    ResNet-50's 100 MB are hashed beside the build, not after it (the manifest read the file a
    second time and hashed it at the end of every convert: ~0.15 s)."""
    future: concurrent.futures.Future[str] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(hashlib.sha256(data).hexdigest())
        except BaseException as err:  # noqa: BLE001 - handed to whoever reads the digest
            future.set_exception(err)

    threading.Thread(target=run, name="amptool-sha256", daemon=True).start()
    return future


def _read_model(path: str) -> tuple[onnx.ModelProto, concurrent.futures.Future[str]]:
    """``onnx.load(path)`` (the format by the file's extension, external data from beside it), from
    bytes read once: the manifest's hash of the file is taken from the same bytes."""
    with open(path, "rb") as handle:
        data = handle.read()
    digest = _sha256_in_background(data)
    fmt = onnx.serialization.registry.get_format_from_file_extension(os.path.splitext(path)[1]) or "protobuf"
    model = onnx.serialization.registry.get(fmt).deserialize_proto(data, onnx.ModelProto())
    onnx.external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    return model, digest


def checker_failure(path: str) -> str | None:
    """What onnx's strict shape inference (the part of the full check beyond the load's) says is
    wrong with the model at ``path`` — a negative Tile repeat, an axis out of range; None when it
    passes or cannot run. Run only after a build failed: the load accepts what onnxruntime opens, and
    an output declared without a shape (which the plain check also flags) is no reason to blame."""
    try:
        model = onnx.load(path)
    except Exception:  # noqa: BLE001 - it loaded once; if it cannot now, there is nothing to say
        return None
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as err:
        return error_summary(err)
    except Exception:  # noqa: BLE001 - a model over 2 GB cannot be serialised for it: no verdict
        return None
    return None


def load_model(path: str) -> LoadedModel:
    """Read, check and name an ONNX model; raise UserError with a hint on anything wrong."""
    check_regular_file(path, "Model file", "Pass a .onnx file.", max_bytes=physical_memory())
    try:
        model, digest = _read_model(path)
    except Exception as err:  # protobuf raises DecodeError, external data raises OSError
        raise UserError(
            f"{path} is not a readable ONNX model ({type(err).__name__}: {error_summary(err)})",
            "Pass a .onnx file exported by torch.onnx, tf2onnx or similar; "
            "keep external data files next to it.",
        ) from err
    if not model.graph.node and not model.graph.output:
        raise UserError(f"{path} is not an ONNX model (empty graph)", "Check the file.")
    try:
        # By path: the checker reads the file itself, rather than Python serialising the loaded
        # model for it (ResNet-50: 0.33 s → 0.2 s), and a model over 2 GB can be checked at all.
        onnx.checker.check_model(path)
    except Exception as err:
        # The checker is stricter than the runtimes (e.g. an output typed without a shape);
        # a model onnxruntime loads is one users run, so accept it with a warning.
        if not _onnxruntime_accepts(model):
            raise UserError(
                f"{path} is not a valid ONNX model: {error_summary(err)}",
                "Run onnx.checker.check_model on it and fix the exporter's output.",
            ) from err
        log.warning("%s fails onnx.checker (%s) but onnxruntime loads it; continuing", path, error_summary(err))
    _refuse_strings(model, path)
    _refuse_future_opset(model, path)
    name_nodes(model.graph)
    from amptool.frontend.gradient import check_gradients  # noqa: PLC0415 (gradient imports load)

    check_gradients(model)  # an unsupported Gradient is a user error now, not after prepare
    return LoadedModel(model=model, path=path, opset=default_opset(model), digest=digest)


def _onnxruntime_accepts(model: onnx.ModelProto) -> bool:
    from amptool.runtime.onnxruntime_runner import session  # noqa: PLC0415

    try:
        session(model, optimize="disable")
    except Exception:  # noqa: BLE001 - any refusal by onnxruntime means it cannot run the model
        return False
    return True


def name_nodes(graph: onnx.GraphProto, prefix: str = "") -> None:
    """Give every unnamed node (subgraphs included) a unique deterministic name."""
    taken = {n.name for n in graph.node if n.name}
    for index, node in enumerate(graph.node):
        if not node.name:
            candidate = f"{prefix}{node.op_type}_{index}"
            while candidate in taken:
                candidate += "_"
            node.name = candidate
            taken.add(candidate)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                name_nodes(attr.g, prefix=f"{node.name}/{attr.name}/")
            for sub in attr.graphs:
                name_nodes(sub, prefix=f"{node.name}/{attr.name}/")



def refuse_quantized(model: onnx.ModelProto, path: str) -> None:
    """A model already quantized has nothing to gain from float16/bfloat16 and its integer parts
    must stay as they are: refused for those dtypes (``--dtype float32`` builds it as it is)."""
    found = collections.Counter(
        n.op_type for n in iter_nodes(model.graph) if n.op_type in QUANTIZED_OPS
    )
    if found:
        ops = ", ".join(f"{op} ×{count}" for op, count in sorted(found.items()))
        raise UserError(
            f"{path} is already quantized ({ops}); amptool converts float32 models to "
            "float16/bfloat16",
            "Convert the float32 export of this model instead, or build this one as it is with --dtype float32.",
        )


def _refuse_future_opset(model: onnx.ModelProto, path: str) -> None:
    """An opset newer than any onnx knows has no defined semantics: onnxruntime refuses it, and
    amptool must not read its ops as some older opset's (opset 99 converted, exit 0)."""
    opset, newest = default_opset(model), onnx.defs.onnx_opset_version()
    if opset > newest:
        raise UserError(f"{path} imports ONNX opset {opset}; the newest is {newest}",
                        f"Export the model with an opset of at most {newest} (torch.onnx.export(opset_version=N)).")


def _refuse_strings(model: onnx.ModelProto, path: str) -> None:
    tensors = list(model.graph.input) + list(model.graph.output)
    for value in tensors:
        if value.type.tensor_type.elem_type == onnx.TensorProto.STRING:
            raise UserError(
                f"{path}: tensor '{value.name}' holds strings; string tensors are not supported",
                "Move string pre/post-processing out of the model.",
            )

