"""The CPU pipeline's layout stage: convolutions, and the layers between them, in NHWC.

What: one pass, ``amptool.ToNHWC``, run before legalization when a conv ``wants_nhwc`` —

    clip → minimum/maximum   ``relax.clip`` has no layout rule in TVM; its two halves do (same values)
    stack → concat           TVM's rule for ``relax.stack`` fails on every call; expand_dims + concat
    ConvertLayout            each conv ``wants_nhwc`` accepts becomes NHWC (its OIHW weight stays a
                             constant: legalization packs it); elementwise ops, pooling, reductions
                             and concat between such convs follow; a transpose back to NCHW only
                             where an op needs it (a reshape, a conv kept NCHW, an output)
    common subexpressions    one NCHW → NHWC copy of a tensor several convs read, not one each
    transposes folded        a transpose of a transpose is one (none where they cancel), and an
                             elementwise op of two equally transposed values runs before the
                             transpose (``_fold_permutes``: ConvNeXt's channels-last blocks)
    fold constants           the bias constants ConvertLayout transposed, folded in numpy

Why: :mod:`amptool.compiler.cpu_nhwc`: NHWC register tiles are stored as they are computed and
depthwise layers vectorize along channels; per layer this measured up to 1.6× (1×1 convs) and
2–5× (depthwise) faster than the NCHW kernels, whose tiles were transposed on the way out.

When not: no conv ``wants_nhwc``; TVM's ConvertLayout raising (its layout rule for a 3-D Max
fails, "Invalid SLayout"): the module stays NCHW, logged. Non-CPU targets never run this stage.

Preserves: values (layout changes move data; clip's two halves are TOPI clip's own min and max).
"""

from __future__ import annotations

import logging
from typing import Any

from amptool import _tvm
from amptool._tvm import static_shape
from amptool.dtypes import DTYPES

log = logging.getLogger(__name__)

#: Channels a depthwise conv needs for its channel blocks (one AVX2 vector).
CHANNEL_MULTIPLE = 8
#: Output channels per group a grouped conv needs for the NHWC conv kernel outside a target's
#: context: whole AVX-512 vectors, so each register tile's channels lie in one group
#: (``group_channels`` asks the target being built).
GROUP_CHANNELS = 16


def group_channels() -> int:
    """Output channels per group a grouped conv needs for the NHWC conv kernel: whole SIMD vectors of
    the target being built (8 with AVX2, 16 with AVX-512), ``GROUP_CHANNELS`` outside a target.

    Why the target's: with 16 for every target, AVX2 builds left groups of 8, 24, 40 channels to the
    NCHW grouped kernel, one weight per tap broadcast over a vector of columns: RegNet's 3×3 144 →
    144 in 6 groups at 28² ran 3.1× onnxruntime (``op_sweep.py``), 0.58 ms as NHWC with a vector a
    tile, 0.33 ms with three (``cpu_kernels._vector_counts``; onnxruntime 0.42)."""
    import tvm  # noqa: PLC0415

    from amptool.compiler.cpu_kernels import vector_lanes  # noqa: PLC0415

    target = tvm.target.Target.current(allow_none=True)
    return GROUP_CHANNELS if target is None else max(CHANNEL_MULTIPLE, vector_lanes(target))


def wants_nhwc(call: Any) -> bool:
    """An NCHW/OIHW ``relax.nn.conv2d`` with static shapes, a constant weight and float dtypes
    that the NHWC kernels cover: one group (any output channel count: the kernels pad their
    filters to whole vectors), groups of whole SIMD vectors of output channels each
    (``group_channels``: RegNet's 64-channel groups, its 24-channel ones with AVX2), or depthwise
    (channel multiplier 1) over a multiple of 8 channels."""
    import tvm  # noqa: PLC0415

    attrs = call.attrs
    data, weight = call.args
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCHW", "OIHW", "NCHW"):
        return False
    if not isinstance(weight, tvm.ir.GenericConst):
        return False
    shape = static_shape(data)
    wshape = static_shape(weight)
    dtypes = {str(data.ty.dtype), str(weight.ty.dtype), str(call.ty.dtype)}
    if shape is None or wshape is None or len(shape) != 4 or not dtypes <= set(DTYPES) or 0 in shape:
        return False  # (an empty map has no tiles to plan: TVM's legalization takes it)
    groups, out_channels, in_channels = int(attrs.groups), wshape[0], shape[1]
    if groups == 1 or (out_channels % groups == 0 and (out_channels // groups) % group_channels() == 0):
        return True
    return groups == in_channels == out_channels and wshape[1] == 1 and out_channels % CHANNEL_MULTIPLE == 0


def layout_passes() -> list[Any]:
    """The ``layout`` stage's passes (see the module docstring)."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    def desired(call: Any) -> dict[str, list[str]]:
        """ConvertLayout's per-call choice: NHWC where ``wants_nhwc``; NCHW kept explicitly for the
        other convs (without an answer a conv follows its input's layout)."""
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d":
            return {"relax.nn.conv2d": ["NHWC", "OIHW"] if wants_nhwc(call) else ["NCHW", "OIHW"]}
        return {}

    @tvm.transform.module_pass(opt_level=0, name="amptool.ToNHWC")
    def to_nhwc(mod: Any, _ctx: Any) -> Any:
        from amptool.passes.fold_constants import fold_constants  # noqa: PLC0415

        if not _any_conv(mod, wants_nhwc):
            return mod
        converted = _convert_layout(_layout_friendly(mod), desired)
        if converted is None:
            return mod
        # A tensor read by several NHWC convs (a transposed conv's phase convs, branches off a model's
        # input) got one transpose per conv: one is enough.
        shared = relax.transform.EliminateCommonSubexpr(call_only=True)(converted)
        return fold_constants(_fold_permutes(shared))

    return [to_nhwc]


#: Bindings of a dataflow block from which ConvertLayout runs on the parts that hold its convs alone
#: (``_convert_layout``): TVM 0.27's pass takes time growing with the square of a block's bindings.
LAYOUT_PREFIX_BINDINGS = 2000
#: Layout-following ops (elementwise, pooling, casts) a part takes past its last conv, at most; convs
#: closer together than this share a part (a CNN's whole body is one).
PREFIX_FOLLOWERS = 256
_FOLLOWERS = frozenset(f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "nn.relu", "sigmoid", "tanh", "nn.silu",
    "nn.gelu", "nn.gelu_tanh", "nn.leakyrelu", "astype", "nn.max_pool2d", "nn.avg_pool2d"))


def _convert_layout(mod: Any, desired: Any) -> Any | None:
    """TVM's ConvertLayout over ``mod`` — over its convs' parts alone where a long block holds them in a
    few stretches (``_outline_conv_parts``), the rest left as it was and the parts inlined back; None
    where the pass raises (the convs stay NCHW). Only TVM's pass is caught: a fault of ours surfaces.

    Why: the pass's time grows with the square of a block's bindings. A speech model's two convs in
    front of three unrolled bidirectional LSTMs (200 steps, 9,655 bindings) spent 19.8 s of a 29 s
    convert in it; sequencer2d_s's four patch-embedding convs between unrolled 2-D LSTMs (12,274
    bindings) 28.4 s of 36. Away from the convs nothing has a layout to choose."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    def convert(module: Any) -> Any | None:
        try:
            return relax.transform.ConvertLayout({}, desired)(module)
        except Exception as err:  # noqa: BLE001 - TVM's layout rules raise on some ops (3-D Max: "Invalid SLayout")
            log.info("convolutions kept in NCHW: TVM's ConvertLayout failed (%s)", str(err).splitlines()[-1:])
            return None

    outlined = _outline_conv_parts(mod)
    if outlined is None:
        return convert(mod)
    whole, parts = outlined
    converted = convert(tvm.IRModule(dict(parts)))
    if converted is None:
        return None
    for gv, _ in parts:
        whole.update_func(gv, converted[gv])
    return relax.transform.CanonicalizeBindings()(relax.transform.InlinePrivateFunctions()(whole))


def _conv_parts(bindings: list[Any], convs: list[int]) -> list[tuple[int, int]]:
    """[start, end) ranges of ``bindings``: each from a conv to past the last conv within
    ``PREFIX_FOLLOWERS`` of it, then past the layout-following ops after that (at most as many)."""
    parts: list[tuple[int, int]] = []
    for index in convs:
        if parts and index - parts[-1][1] <= PREFIX_FOLLOWERS:
            parts[-1] = (parts[-1][0], index + 1)
        else:
            parts.append((index, index + 1))
    extended = []
    for start, end in parts:
        last_conv = end - 1
        while end < len(bindings) and end - last_conv <= PREFIX_FOLLOWERS and _tvm.op_name(bindings[end].value) \
                in _FOLLOWERS:
            end += 1
        extended.append((start, end))
    return extended


def _outline_conv_parts(mod: Any) -> tuple[Any, list[tuple[Any, Any]]] | None:
    """(module, [(GlobalVar, function)]) with each part of ``main``'s dataflow block that holds convs
    (``_conv_parts``) a private function of the values it reads, returning those read after it,
    ``main`` calling it and binding them to their own variables. None where ``main`` is not one long
    block of which the convs' parts are a small share."""
    import tvm  # noqa: PLC0415
    import tvm_ffi  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    functions = _tvm.relax_functions(mod)
    if len(functions) != 1 or functions[0][0].name_hint != "main":
        return None
    main_gv, func = functions[0]
    body = func.body
    if not isinstance(body, relax.SeqExpr) or not body.blocks or not isinstance(body.blocks[0], relax.DataflowBlock):
        return None
    bindings = list(body.blocks[0].bindings)
    conv = tvm.ir.Op.get("relax.nn.conv2d")
    convs = [i for i, b in enumerate(bindings) if isinstance(b.value, relax.Call) and _tvm.calls_op(b.value, conv)]
    everywhere = sum(1 for call in _tvm.bound_calls(func) if _tvm.calls_op(call, conv))
    if len(bindings) < LAYOUT_PREFIX_BINDINGS or not convs or everywhere != len(convs):
        return None  # short, no conv, or a conv outside the block's top level (a branch, a later block)
    parts = _conv_parts(bindings, convs)
    if len(bindings) - sum(end - start for start, end in parts) < LAYOUT_PREFIX_BINDINGS // 2:
        return None
    if any(isinstance(b, relax.MatchCast) for start, end in parts for b in bindings[start:end]):
        return None  # a symbolic dim defined in a part would be out of scope after it: the whole block, then
    after = relax.SeqExpr([*body.blocks[1:]], body.body)
    builder = relax.BlockBuilder(mod)
    kept: list[Any] = []
    outlined: list[tuple[Any, Any]] = []
    done = 0
    for number, (start, end) in enumerate(parts):
        kept += bindings[done:start]
        part = bindings[start:end]
        later = relax.SeqExpr([relax.DataflowBlock(bindings[end:])], after) if end < len(bindings) else after
        reads, writes = _free_vars(part), _defined_vars(part)
        needed = _vars_in(later, writes, tvm_ffi)
        if not needed:  # nothing after it reads the part: it stays where it is
            kept += part
            done = end
            continue
        params = [relax.Var(_tvm.var_name(v), v.ty) for v in reads]
        outs = [relax.Var(f"{_tvm.var_name(v)}_out", v.ty) for v in needed]
        block = relax.DataflowBlock([*(relax.VarBinding(v, p) for v, p in zip(reads, params, strict=True)), *part,
                                     *(relax.VarBinding(o, v) for o, v in zip(outs, needed, strict=True))])
        function = relax.Function(params, relax.SeqExpr([block], relax.Tuple(outs)),
                                  relax.TupleType([v.ty for v in needed]))
        gv = builder.add_func(function, f"amptool_conv_part{number}")  # typed, private: inlined back later
        result = relax.DataflowVar(f"conv_part{number}", function.ret_ty)
        kept += [relax.VarBinding(result, relax.Call(gv, list(reads))),
                 *(relax.VarBinding(v, relax.TupleGetItem(result, i)) for i, v in enumerate(needed))]
        outlined.append((gv, function))
        done = end
    kept += bindings[done:]
    if not outlined:
        return None
    main = relax.Function(func.params, relax.SeqExpr([relax.DataflowBlock(kept), *body.blocks[1:]], body.body),
                          func.ret_ty, func.is_pure, func.attrs)
    builder.update_func(main_gv, main)
    whole = builder.get()
    return whole, [(gv, whole[gv]) for gv, _ in outlined]


def _defined_vars(bindings: list[Any]) -> dict[int, Any]:
    return {b.var.__chandle__(): b.var for b in bindings}


def _free_vars(bindings: list[Any]) -> list[Any]:
    """The variables ``bindings`` read that they do not define, in order of first use."""
    from tvm import relax  # noqa: PLC0415

    defined = _defined_vars(bindings)
    free: dict[int, Any] = {}
    for binding in bindings:
        for var in relax.analysis.free_vars(binding.value):
            if var.__chandle__() not in defined:
                free.setdefault(var.__chandle__(), var)
    return list(free.values())


def _vars_in(expr: Any, wanted: dict[int, Any], tvm_ffi: Any) -> list[Any]:
    """The variables of ``wanted`` that ``expr`` reads, once each."""
    from tvm import relax  # noqa: PLC0415

    found: dict[int, Any] = {}

    def seen(var: Any) -> None:  # (a walk callback returns nothing: a value would be read as an instruction)
        if var.__chandle__() in wanted:
            found.setdefault(var.__chandle__(), var)

    tvm_ffi.structural_walk(expr, (relax.Var, seen))
    return list(found.values())


#: Rounds of ``_fold_permutes``: each sinks the transposes of one more residual add of a chain.
FOLD_ROUNDS = 64


def _fold_permutes(mod: Any) -> Any:
    """``mod`` with each transpose of a transpose as one transpose of the source (none where they
    cancel), transposes that keep every axis dropped, and an elementwise op of two equally
    transposed values read nowhere else computed before the transpose; rounds until nothing moves.

    Why: ConvertLayout puts its own transposes beside the model's. ConvNeXt transposes to channels
    last around each block's LayerNorm and MLP and adds the residual in NCHW: in NHWC that was a
    transpose back to NCHW, the add, and a transpose to NHWC again — copies of the map for nothing."""
    import tvm_ffi  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    for _ in range(FOLD_ROUNDS):
        folded = relax.transform.DeadCodeElimination()(_tvm.rewrite_functions(mod, _permute_folder(mod)))
        if tvm_ffi.structural_equal(folded, mod):
            return folded
        mod = folded
    return mod


#: Elementwise ops ``_fold_permutes`` computes before a transpose both their operands share.
_ELEMENTWISE = frozenset(f"relax.{name}" for name in ("add", "subtract", "multiply", "divide", "maximum", "minimum"))


def _permute_folder(mod: Any) -> Any:
    """One round of ``_fold_permutes``: a Relax mutator over ``mod``."""
    import tvm_ffi  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    uses: dict[int, int] = {}
    for _gv, func in _tvm.relax_functions(mod):
        uses.update(_tvm.var_uses(func))

    def axes_of(call: Any) -> list[int] | None:
        """A transpose's axes (None: its operand's rank is unknown)."""
        ndim = getattr(call.args[0].ty, "ndim", -1)
        if ndim < 0:
            return None
        return list(range(ndim))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]

    @mutator
    class _Folder(PyExprMutator):
        def transposed(self, value: Any) -> tuple[Any, list[int]] | None:
            """(source, axes) when ``value`` is a variable bound to a transpose."""
            if not isinstance(value, relax.Var):
                return None
            bound = self.lookup_binding(value)
            axes = axes_of(bound) if _tvm.op_name(bound) == "relax.permute_dims" else None
            return None if axes is None else (bound.args[0], axes)

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            name = _tvm.op_name(call)
            if name == "relax.permute_dims":
                return self.fold(call)
            if name in _ELEMENTWISE and len(call.args) == 2:
                return self.sink(call)
            return call

        def fold(self, call: Any) -> Any:
            outer = axes_of(call)
            if outer is None:
                return call
            source, axes = call.args[0], outer
            inner = self.transposed(source)
            if inner is not None:
                source, axes = inner[0], [inner[1][a] for a in outer]
            if axes == list(range(len(axes))):
                return source
            return call if source.same_as(call.args[0]) else relax.op.permute_dims(source, axes)

        def sink(self, call: Any) -> Any:
            sides = [self.transposed(arg) for arg in call.args]
            if (None in sides or sides[0][1] != sides[1][1]  # type: ignore[index]
                    or any(uses.get(arg.__chandle__(), 0) != 1 for arg in call.args)
                    or not tvm_ffi.structural_equal(sides[0][0].ty, sides[1][0].ty)):  # type: ignore[index]
                return call
            inner = self.builder_.emit(relax.Call(call.op, [side[0] for side in sides], call.attrs))  # type: ignore[index]
            return relax.op.permute_dims(inner, sides[0][1])  # type: ignore[index]

    return _Folder(mod)


def _any_conv(mod: Any, accept: Any) -> bool:
    """Whether a binding of ``mod`` is a ``relax.nn.conv2d`` that ``accept`` takes."""
    import tvm  # noqa: PLC0415

    conv = tvm.ir.Op.get("relax.nn.conv2d")
    return _tvm.any_call(mod, lambda call: _tvm.calls_op(call, conv) and accept(call))


def _layout_friendly(mod: Any) -> Any:
    """``mod`` with the ops TVM's ConvertLayout cannot take written as ops it can, same values:

    * ``clip(x, lo, hi)`` on a float tensor as ``maximum(minimum(x, hi), lo)`` (TOPI's clip, op by
      op): ``relax.clip`` has no layout rule.
    * ``stack(xs, axis)`` as ``concat`` of each ``expand_dims(x, axis)``: ConvertLayout's rule for
      stack fails on every call ("String index out of bounds"), and so the whole module stayed
      NCHW — a CRNN text recogniser (convs, then a GRU whose steps are stacked) among them."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    clip, stack = tvm.ir.Op.get("relax.clip"), tvm.ir.Op.get("relax.stack")

    @mutator
    class _Rewriter(PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op):
                return call
            if call.op.same_as(clip):
                return self._clip(call)
            if call.op.same_as(stack) and isinstance(call.args[0], relax.Tuple):
                axis = int(call.attrs.axis)
                parts = [self.builder_.emit(relax.op.expand_dims(x, axis)) for x in call.args[0].fields]
                return relax.op.concat(parts, axis=axis)
            return call

        def _clip(self, call: Any) -> Any:
            x, low, high = call.args
            dtype = str(getattr(x.ty, "dtype", ""))
            if dtype not in DTYPES or not all(isinstance(b, (tvm.tirx.FloatImm, tvm.tirx.IntImm)) for b in (low, high)):
                return call
            upper = relax.op.minimum(x, relax.const(float(high.value), dtype))
            return relax.op.maximum(self.builder_.emit(upper), relax.const(float(low.value), dtype))

    return _tvm.rewrite_functions(mod, _Rewriter(mod))
