"""Attention as one CPU kernel: scores, softmax and the product with V per block of query rows.

What: ``matmul(softmax(chain(matmul(q, kᵀ)), axis=-1), v)`` — ``chain`` a run of elementwise
adds, subtracts, multiplies and divides by constants or tensors broadcast to the scores (a scale,
an attention mask, a causal mask) — becomes one kernel (``attention``): for each block of ``R``
query rows (up to ``ROW_CAP``), the rows' scores (a register tile of ``R`` rows × whole vectors of
keys), their max, exponentials and sum, and their product with ``v`` (a register tile of ``R``
rows × a chunk of ``v``'s column vectors) — all within one task, the scores never leaving the
cache; tiles sized to the target's vector registers (32 with AVX-512, 16 with AVX2). A key count no vector
divides reads ``kᵀ`` padded with zero columns (a small kernel of its own), the padded scores
masked to −inf; a query count no block divides (ViT's 197) reads ``q`` padded with zero rows,
the extra results cropped.

Why: as three kernels the scores make four trips through memory (written, read and written by
the softmax, read by the product). Whisper's encoder (6 heads × 1500 × 1500 scores, 54 MB a
layer) spent ~76 ms a layer on them at one thread, onnxruntime ~42; this kernel ~38 (measured
in benchmarks/README.md, thirteenth session).

Float16/bfloat16 builds: the mixed-precision pass leaves q, kᵀ and v in the low dtype, the two
products accumulating (``out_dtype``) and the softmax computing in float32, the probabilities
cast to the low dtype before the product, and sometimes a scale step in the low dtype; the kernel
does the same in float32 with each of those roundings (q, kᵀ, v widened first) — so its values
are the three kernels' up to summation order.

When not: fewer than ``MIN_KEYS`` keys (the scores stay in cache between the three kernels);
bfloat16 products that AMX tiles take (``amx_plan.takes_attention``: the three kernels are faster);
shapes that are not static; dtypes other than those two arrangements; ``v`` columns no 16-lane
vector divides; an intermediate (the scores, the probabilities) used elsewhere, e.g. returned as
attention weights; batch dims that differ between ``q``, ``kᵀ`` and ``v``.

Preserves: softmax's values up to float rounding (sums in another order, the project's exp
polynomial); an all −inf row gives NaN, as the softmax does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from amptool import _tvm
from amptool._tvm import static_shape
from amptool.compiler.cpu_kernels import DEFAULT_L1_BYTES
from amptool.dtypes import DTYPES

#: Keys from which attention is one kernel. Measured (12 heads × 64, one thread, kernel sums,
#: three kernels → one): 128 keys 0.93 → 1.05 ms, 192 1.98 → 1.33, 256 4.14 → 2.44 — below ~192
#: the scores stay in cache between the three kernels, and they are the faster.
MIN_KEYS = 192

#: L1 data cache a task's row buffers should fit: the 32 KiB assumed of any x86 core since Haswell
#: (48 on Ice Lake), for every target alike.
L1_BYTES = DEFAULT_L1_BYTES

#: Block names of the kernel (the schedule finds it by ``SCORES_BLOCK``).
SCORES_BLOCK = "amp_attention_scores"
_MAX, _EXP, _SUM, _PRODUCT, _OUT = ("amp_attention_max", "amp_attention_exp", "amp_attention_sum",
                                    "amp_attention_product", "amp_attention_out")
_INVERSE, _WEIGHTS = "amp_attention_inverse", "amp_attention_weights"  # (builds that round the probabilities)

_LANES = 16  # float32 lanes of the key blocks (AVX-512); narrower targets split each block
_FLOATS = DTYPES
_CHAIN_OPS = {"relax.add": "add", "relax.subtract": "subtract", "relax.multiply": "multiply",
              "relax.divide": "divide"}


@dataclass(frozen=True)
class _Step:
    """One elementwise step between the scores and the softmax: ``op`` with ``operand``, the scores
    on the left unless ``scores_right``, its result in ``dtype`` (a float16 build's scale: computed
    in float32 and rounded, which gives float16 arithmetic's result); or ``op`` "round", a cast to
    the low ``dtype`` (no operand)."""

    op: str
    operand: Any
    scores_right: bool
    dtype: str = "float32"


@dataclass(frozen=True)
class _Match:
    q: Any
    kt: Any
    v: Any
    steps: tuple[_Step, ...]
    fused: frozenset[Any]  # the bindings the kernel replaces (scores, steps, probabilities)
    nan_to_zero: bool  # rows whose probabilities are NaN (all keys masked) give zeros
    rounding: str | None  # the dtype the probabilities are cast to before the product (float16 builds)


def fuse_attention(mod: Any) -> Any:
    """``mod`` with each attention ``_match`` accepts computed by one kernel (module docstring)."""
    from tvm.relax.expr_functor import PyExprMutator, mutator  # noqa: PLC0415

    matches: dict[Any, _Match] = {}
    for _gv, func in _tvm.relax_functions(mod):
        matches.update(_matches(func))
    if not matches:
        return mod
    skipped = frozenset().union(*(m.fused for m in matches.values()))

    @mutator
    class _Attention(PyExprMutator):
        def visit_var_binding_(self, binding: Any) -> None:
            if binding.var in skipped:
                return
            match = matches.get(binding.var)
            if match is None:
                super().visit_var_binding_(binding)
                return
            out = _emit(self.builder_, match, self.visit_expr)
            self.set_var_remap(binding.var, self.builder_.emit(out, name_hint=_tvm.var_name(binding.var)))

    return _tvm.rewrite_functions(mod, _Attention(mod))


def _matches(func: Any) -> dict[Any, _Match]:
    """The attention outputs of ``func`` (the product's binding var) and what each replaces."""
    from tvm import relax  # noqa: PLC0415

    graph = _Graph(func)
    found: dict[Any, _Match] = {}
    for var, value in graph.values.items():
        if not isinstance(value, relax.Call) or _tvm.op_name(value) != "relax.matmul":
            continue
        probabilities, v = value.args
        unwrapped = graph.probabilities_from(probabilities)
        if unwrapped is None:
            continue
        probabilities, fused, nan_to_zero, rounding = unwrapped
        softmax: Any = graph.values[probabilities]
        start, casts = graph.through_casts(softmax.args[0])
        fused += casts
        walked = graph.steps_from(start)
        if walked is None:
            continue
        scores, steps, chain = walked
        q, kt = graph.values[scores].args
        match = _Match(q, kt, v, steps, frozenset([*fused, *chain, scores]), nan_to_zero, rounding)
        if _accepts(match, softmax, graph.values[scores], value):
            found[var] = match
    return found


class _Graph:
    """A Relax function's bindings (var → value) and how often each var is used."""

    def __init__(self, func: Any) -> None:
        from tvm import relax  # noqa: PLC0415

        self.values: dict[Any, Any] = {}
        self.uses = _tvm.var_uses(func)  # variable handle → reads
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding, relax.VarBinding):
                    self.values[binding.var] = binding.value

    def single(self, var: Any, ops: tuple[str, ...]) -> Any | None:
        """``var``'s value when ``var`` is a dataflow var used once, bound to a call of one of ``ops``."""
        from tvm import relax  # noqa: PLC0415

        value = self.values.get(var)
        if (not isinstance(var, relax.DataflowVar) or self.uses[var.__chandle__()] != 1
                or _tvm.op_name(value) not in ops):
            return None
        return value

    def probabilities_from(self, var: Any) -> tuple[Any, list[Any], bool, str | None] | None:
        """From the product's left operand back to the softmax, past identity casts, SDPA's
        ``where(isnan(p), 0, p)`` and a float16/bfloat16 build's cast of the probabilities, in
        either order: (the softmax's var, the vars passed, whether NaN rows give zeros, the cast's
        dtype or None); None when something else is in between or is used elsewhere."""
        from tvm import relax  # noqa: PLC0415

        fused: list[Any] = []
        nan_to_zero, rounding, used = False, None, 1
        while True:
            var, casts = self.through_casts(var)
            fused += casts
            cast = self.single(var, ("relax.astype",))
            unzeroed = None if nan_to_zero else self.nan_zeroed(var)
            if cast is not None and rounding is None:
                fused.append(var)
                rounding, var, used = _tvm.tensor_dtype(var), cast.args[0], 1
            elif unzeroed is not None:
                fused += [var, self.values[var].args[0]]
                nan_to_zero, var, used = True, unzeroed, 2  # (p is read by the isnan and the where)
            else:
                break
        if (not isinstance(var, relax.DataflowVar) or _tvm.op_name(self.values.get(var)) != "relax.nn.softmax"
                or self.uses[var.__chandle__()] != used):
            return None
        fused.append(var)
        return var, fused, nan_to_zero, rounding

    def through_casts(self, var: Any) -> tuple[Any, list[Any]]:
        """Past casts to the dtype a tensor already has (an export's ``.float()`` on float32: GPT-2's
        probabilities): the var they cast, and their own vars."""
        passed: list[Any] = []
        while (cast := self.single(var, ("relax.astype",))) is not None:
            if _tvm.tensor_dtype(cast.args[0]) != _tvm.tensor_dtype(var):
                break
            passed.append(var)
            var = cast.args[0]
        return var, passed

    def nan_zeroed(self, var: Any) -> Any | None:
        """For ``var = where(isnan(p), 0, p)`` (used once, its test too), ``p``; else None."""
        where = self.single(var, ("relax.where",))
        if where is None:
            return None
        test, zero, p = where.args
        isnan = self.single(test, ("relax.isnan",))
        if isnan is None or not isnan.args[0].same_as(p) or not _tvm.is_constant(zero):
            return None
        if _tvm.constant_numpy(zero).any():
            return None
        return p

    def steps_from(self, var: Any) -> tuple[Any, tuple[_Step, ...], list[Any]] | None:
        """From the softmax's input back to the scores' matmul: (the scores' var, the steps in
        order, the steps' vars); None when something else is in between or is used elsewhere."""
        steps: list[_Step] = []
        chain: list[Any] = []
        carried = (*_CHAIN_OPS, "relax.matmul", "relax.astype")
        while (value := self.single(var, carried)) is not None:
            name = str(_tvm.op_name(value))
            dtype = str(_tvm.tensor_dtype(var))
            if name == "relax.matmul":
                return var, tuple(reversed(steps)), chain
            if name == "relax.astype":  # a float16 build's casts: to the low dtype rounds, back is exact
                if dtype not in _FLOATS:
                    return None
                if dtype != "float32":
                    steps.append(_Step("round", None, False, dtype))
                chain.append(var)
                var = value.args[0]
                continue
            # The argument carrying the scores: the one that is itself a step or the scores' matmul.
            carriers = [i for i, arg in enumerate(value.args) if self.single(arg, carried) is not None]
            if len(carriers) != 1:
                return None
            scores_right = carriers[0] == 1
            steps.append(_Step(_CHAIN_OPS[name], value.args[0 if scores_right else 1], scores_right, dtype))
            chain.append(var)
            var = value.args[carriers[0]]
        return None


def _accepts(match: _Match, softmax: Any, scores: Any, product: Any) -> bool:
    """The kernel's conditions (module docstring, "When not")."""
    shapes = [static_shape(x) or [] for x in (match.q, match.kt, match.v, scores, product)]
    if any(len(shape) < 2 for shape in shapes):
        return False
    q, kt, v, z, _ = shapes
    # float32 throughout; or a float16/bfloat16 build's: q, kᵀ, v and the probabilities' cast in the
    # low dtype, the products accumulated (out_dtype) and the softmax computed in float32.
    low = {_tvm.tensor_dtype(x) for x in (match.q, match.kt, match.v)}
    if len(low) != 1 or not low <= set(_FLOATS):
        return False
    if (match.rounding or "float32") != next(iter(low)):
        return False
    if any(_tvm.tensor_dtype(x) != "float32" for x in (scores, softmax, product)):
        return False
    rank = len(z)
    if int(softmax.attrs.axis) % rank != rank - 1 or not len(q) == len(kt) == len(v) == rank:
        return False
    if not q[:-2] == kt[:-2] == v[:-2] or kt[-1] != v[-2] or kt[-2] != q[-1]:
        return False
    keys, columns = kt[-1], v[-1]
    if keys < MIN_KEYS or columns % _LANES:
        return False
    from amptool.compiler import amx_plan  # noqa: PLC0415 - TVMScript parsing on first use

    if amx_plan.takes_attention(q, keys, str(next(iter(low)))):
        return False  # bfloat16 products on AMX tiles beat the fused float32 kernel
    for step in match.steps:
        if step.operand is None:
            continue
        operand = static_shape(step.operand)
        if operand is None or _tvm.tensor_dtype(step.operand) not in _FLOATS or len(operand) > rank:
            return False
        if any(d not in (1, full) for d, full in zip(reversed(operand), reversed(z), strict=False)):
            return False
    return True


#: The most query rows a task takes: a 6 × 4-vector product tile on AVX-512 (24 of 32 registers;
#: 4 rows went 38 → 47 ms on Whisper's attention, 8 spilled: 93).
ROW_CAP = 6


def _row_block(rows: int) -> int:
    """Query rows per task: all of them when fewer than ``ROW_CAP`` (a decoding step's one row);
    else ``ROW_CAP`` or one fewer where either divides ``rows``, else ``ROW_CAP`` over rows padded
    to its multiple (``_padded_rows``; ViT's 197 tokens → 198)."""
    if rows <= ROW_CAP:
        return rows
    return next((r for r in (ROW_CAP, ROW_CAP - 1) if rows % r == 0), ROW_CAP)


def _padded_rows(rows: int) -> int:
    block = _row_block(rows)
    return block * math.ceil(rows / block)


def _emit(bb: Any, match: _Match, remap: Any) -> Any:
    """The kernel's call (and ``kᵀ``'s padded copy when the keys need one)."""
    # A float16/bfloat16 build's q, kᵀ and v widened to float32 first (small: no scores): converted
    # in the kernel's inner loops, Whisper's attention took 96 ms a layer in float16, 88 after.
    q, kt, v = (remap(x) if _tvm.tensor_dtype(x) == "float32" else
                bb.emit(bb.call_te(_widened, remap(x), primfunc_name_hint="amp_attention_widen"))
                for x in (match.q, match.kt, match.v))
    operands = [remap(step.operand) for step in match.steps if step.operand is not None]
    keys = (static_shape(match.kt) or [0])[-1]
    padded = _LANES * math.ceil(keys / _LANES)
    if padded != keys:
        kt = bb.emit(bb.call_te(_pad, kt, axis=-1, padded=padded, primfunc_name_hint="amp_attention_pad_keys"))
    rows = (static_shape(match.q) or [0, 0])[-2]
    padded_rows = _padded_rows(rows)
    if padded_rows != rows:  # q's extra rows are zeros; their results are cropped
        q = bb.emit(bb.call_te(_pad, q, axis=-2, padded=padded_rows, primfunc_name_hint="amp_attention_pad_queries"))
    out = bb.call_te(_attention, q, kt, v, *operands, keys=keys,
                     steps=[(s.op, s.scores_right, s.dtype) for s in match.steps],
                     nan_to_zero=match.nan_to_zero, rows=rows, rounding=match.rounding, primfunc_name_hint="attention")
    if padded_rows == rows:
        return out
    return bb.call_te(_crop_rows, bb.emit(out), rows=rows, primfunc_name_hint="amp_attention_crop_queries")


def _pad(x: Any, axis: int, padded: int) -> Any:
    """``x`` with zeros past its extent along ``axis`` (negative: from the end), up to ``padded``."""
    from tvm import te, tirx  # noqa: PLC0415

    shape = [int(d) for d in x.shape]
    axis %= len(shape)
    extent = shape[axis]

    def value(*i: Any) -> Any:
        inside = (*i[:axis], tirx.min(i[axis], extent - 1), *i[axis + 1:])
        return tirx.if_then_else(i[axis] < extent, x(*inside), tirx.const(0.0, x.dtype))

    return te.compute((*shape[:axis], padded, *shape[axis + 1:]), value, name="pad")


def _widened(x: Any) -> Any:
    """A float16/bfloat16 tensor as float32, its values rounded to its dtype on the way: fused with
    the cast that made it, TVM's bfloat16 legalization would drop that cast's rounding."""
    from tvm import te  # noqa: PLC0415

    return te.compute(x.shape, lambda *i: _rounded(x(*i).astype("float32"), str(x.dtype)), name="widen")


def _crop_rows(x: Any, rows: int) -> Any:
    from tvm import te  # noqa: PLC0415

    *lead, _, width = (int(d) for d in x.shape)
    return te.compute((*lead, rows, width), lambda *i: x(*i), name="crop_queries")


def _attention(q: Any, kt: Any, v: Any, *operands: Any, keys: int, steps: list[tuple[str, bool, str]],
               nan_to_zero: bool, rows: int, rounding: str | None) -> Any:
    """The kernel over ``q``'s rows (padded past ``rows``, the real ones, to whole blocks) and
    ``kᵀ``'s columns (padded past ``keys``); ``operands``: the steps' (see ``_Step``). Float32
    arithmetic; with ``rounding``, the probabilities are rounded to that dtype before the product
    (as the unfused float16 build's cast does) and the product is over normalized values."""
    from tvm import te, tirx  # noqa: PLC0415

    from amptool.compiler.cpu_exp import exp_nonpositive_f32  # noqa: PLC0415

    *batch, padded_rows, depth = (int(d) for d in q.shape)
    padded = int(kt.shape[-1])
    columns = int(v.shape[-1])
    rank = len(batch) + 2
    d = te.reduce_axis((0, depth), name="d")
    f32 = "float32"
    scores = te.compute((*batch, padded_rows, padded), lambda *i: te.sum(
        q(*i[:-1], d).astype(f32) * kt(*i[:-2], d, i[-1]).astype(f32), axis=d), name=SCORES_BLOCK)

    def broadcast(operand: Any, index: tuple[Any, ...]) -> Any:
        """``operand`` at the scores' ``index``, broadcast; a padded query row reads the last real one."""
        shape = [int(s) for s in operand.shape]
        first = rank - len(shape)
        return operand(*(0 if s == 1 else tirx.min(i, rows - 1) if first + k == rank - 2 else i
                         for k, (s, i) in enumerate(zip(shape, index[first:], strict=True))))

    def stepped(*i: Any) -> Any:
        value = scores(*i)
        taken = iter(operands)
        for op, scores_right, dtype in steps:
            if op != "round":
                other = broadcast(next(taken), i).astype(f32)
                a, b = (other, value) if scores_right else (value, other)
                value = {"add": a + b, "subtract": a - b, "multiply": a * b, "divide": a / b}[op]
            if dtype != f32:
                value = _rounded(value, dtype)
        return tirx.Select(i[-1] < keys, value, tirx.const(float("-inf"), f32))

    masked = te.compute((*batch, padded_rows, padded), stepped, name="amp_attention_masked")
    c1 = te.reduce_axis((0, padded), name="c1")
    top = te.compute((*batch, padded_rows), lambda *i: te.max(masked(*i, c1), axis=c1), name=_MAX)
    exps = te.compute((*batch, padded_rows, padded), lambda *i: exp_nonpositive_f32(masked(*i) - top(*i[:-1])),
                      name=_EXP)
    c2 = te.reduce_axis((0, padded), name="c2")
    total = te.compute((*batch, padded_rows), lambda *i: te.sum(exps(*i, c2), axis=c2), name=_SUM)
    c3 = te.reduce_axis((0, keys), name="c3")
    if rounding is None:
        weights = exps
    else:
        inverse = te.compute((*batch, padded_rows), lambda *i: tirx.const(1.0, f32) / total(*i), name=_INVERSE)
        weights = te.compute((*batch, padded_rows, padded),
                             lambda *i: _rounded(exps(*i) * inverse(*i[:-1]), rounding), name=_WEIGHTS)
    product = te.compute((*batch, padded_rows, columns), lambda *i: te.sum(
        weights(*i[:-1], c3) * v(*i[:-2], c3, i[-1]).astype(f32), axis=c3), name=_PRODUCT)

    def normalized(*i: Any) -> Any:
        value = product(*i) / total(*i[:-1]) if rounding is None else product(*i)
        if not nan_to_zero:
            return value
        # A row whose keys are all masked sums to 0 here (the max starts from float32's lowest, not
        # -inf) and to NaN where a score is NaN: zeros for both, as where(isnan(p), 0, p) gives.
        return tirx.Select(total(*i[:-1]) > tirx.const(0.0, "float32"), value, tirx.const(0.0, "float32"))

    return te.compute((*batch, padded_rows, columns), normalized, name=_OUT)


def _rounded(value: Any, dtype: str) -> Any:
    """A float32 value rounded to ``dtype`` (float16, bfloat16) and widened back. bfloat16 on the
    bits: TVM's bfloat16 legalization drops a cast's rounding inside a kernel (``bf16_bits``)."""
    if dtype != "bfloat16":
        return value.astype(dtype).astype("float32")
    from amptool.compiler.cpu_intrinsics import bf16_bits, low_bf16  # noqa: PLC0415 - registers an intrinsic

    return low_bf16(bf16_bits(value))


def attention(sch: Any, tiling: Any) -> Any | None:
    """Schedule rule for ``attention`` (module docstring): tasks of ``R`` query rows in parallel;
    in each, the scores' register tile (``R`` rows × key vectors, over the depth), the max and sum
    as vector partial results, the exponentials vectorized, the product's register tile (``R``
    rows × a chunk of ``v``'s column vectors, over the keys). Tiles sized to the target's vector
    registers (32 with AVX-512, 16 with AVX2)."""
    from amptool.compiler.cpu_kernels import accumulator_budget  # noqa: PLC0415
    from amptool.compiler.cpu_row_reduction import factor_lanes, vector_partials  # noqa: PLC0415
    from amptool.compiler.cpu_schedules import _extent, _find_block, _parallel  # noqa: PLC0415

    lanes = tiling.lanes
    for name in (_MAX, _SUM):
        factor_lanes(sch, sch.get_sblock(name), lanes)
    out = sch.get_sblock(_OUT)
    *batch, rows_loop, _ = sch.get_loops(out)
    block = _row_block(_extent(sch, rows_loop) or 0)
    row_blocks, rows = sch.split(rows_loop, [None, block])
    task = _parallel(sch, [*batch, row_blocks], tiling)
    rounding: tuple[str, ...] = ()
    if _find_block(sch, _INVERSE) is not None:
        # Builds that round the probabilities: the block's rounded weights as a vectorized row pass
        # of their own where a third [rows, keys] buffer still fits L1 (inlined, each weight is
        # recomputed per column vector), else inlined. float16, one thread: 384 keys 10.75 → 8.66 ms
        # with the pass; 1500 keys 96.0 inlined, 110.2 with it (unfused 111.8).
        keys = _extent(sch, sch.get_loops(sch.get_sblock(_WEIGHTS))[-1]) or 0
        if 3 * block * keys * 4 <= L1_BYTES:
            rounding = (_WEIGHTS, _INVERSE)
        else:
            sch.compute_inline(sch.get_sblock(_WEIGHTS))
            rounding = (_INVERSE,)
    for name in (_PRODUCT, *rounding, _SUM, _SUM + "_rf", _EXP, _MAX, _MAX + "_rf", "amp_attention_masked",
                 SCORES_BLOCK):
        sch.compute_at(sch.get_sblock(name), task, preserve_unit_loops=True)  # (consumers first)
    sch.compute_inline(sch.get_sblock("amp_attention_masked"))
    if _WEIGHTS in rounding:
        _, weight_lanes = sch.split(sch.get_loops(sch.get_sblock(_WEIGHTS))[-1], [None, lanes])
        sch.vectorize(weight_lanes)
    budget = accumulator_budget(lanes)
    _score_tile(sch, sch.get_sblock(SCORES_BLOCK), block, lanes, budget)
    for name in (_MAX + "_rf", _SUM + "_rf"):
        vector_partials(sch, sch.get_sblock(name))
    exp_loop = sch.get_loops(sch.get_sblock(_EXP))[-1]
    _, exp_lanes = sch.split(exp_loop, [None, lanes])
    sch.vectorize(exp_lanes)
    _product_tile(sch, sch.get_sblock(_PRODUCT), block, lanes, 2 * budget)
    out_lanes = sch.split(sch.get_loops(out)[-1], [None, lanes])[1]
    sch.vectorize(out_lanes)
    return sch


def _score_tile(sch: Any, scores: Any, block: int, lanes: int, budget: int) -> None:
    """``block`` rows × as many key vectors as keep ``budget`` accumulators, over the depth."""
    _register_tile(sch, scores, lanes, max(1, budget // block))


def _product_tile(sch: Any, product: Any, block: int, lanes: int, registers: int) -> None:
    """The block's rows × a chunk of ``v``'s column vectors, accumulated over the keys: as many
    vectors as fit ``registers`` with one load each and a broadcast (AVX-512, 6 rows: 4 vectors
    — BERT's 64 columns whole; AVX2: 2)."""
    _register_tile(sch, product, lanes, max(1, (registers - 1) // (block + 1)))


def _register_tile(sch: Any, block: Any, lanes: int, cap: int) -> None:
    """``block``'s last three loops (rows, columns, reduction) as a register tile: all its rows ×
    up to ``cap`` column vectors, accumulated in a local tile over the reduction, rows unrolled and
    each vector a step of its own."""
    from amptool.compiler.cpu_schedules import _divisor  # noqa: PLC0415

    rows, columns, reduction = sch.get_loops(block)[-3:]
    vectors = _divisor(int(sch.get(columns).extent) // lanes, cap) or 1
    chunks, columns = sch.split(columns, [None, vectors * lanes])
    sch.reorder(chunks, reduction, rows, columns)
    tile = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(tile, chunks)
    sch.vectorize(sch.get_loops(tile)[-1])
    steps, column_lanes = sch.split(columns, [None, lanes])
    sch.unroll(steps)
    sch.vectorize(column_lanes)
    sch.unroll(rows)
    init = sch.decompose_reduction(block, reduction)
    sch.vectorize(sch.get_loops(init)[-1])
