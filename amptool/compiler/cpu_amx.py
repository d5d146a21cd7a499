"""bfloat16 matmuls and convs on Intel AMX tiles: constant weights, float32 results.

What: each task computes a 32 × 32 output block as four 16 × 16 float32 tiles, with every 32-deep
step of ``K`` two A tiles (16 rows × 32 bfloat16) and two B tiles (16 ``k`` pairs × 16 columns ×
2) feeding four ``tdpbf16ps`` — 32 768 multiply-adds per four instructions. The micro-kernel is
LLVM IR (:data:`LLVM_IR`) imported into the module with ``pragma_import_llvm`` and called from a
hand-written PrimFunc that walks the blocks in parallel; A is read where it lies (rows are
``K`` bfloat16 apart), B is the weight packed at compile time as ``[N/16, K/2, 16, 2]`` (the
layout ``vdpbf16ps`` kernels use), zero columns padding ``N`` to 32s. A 1×1 stride-1 NHWC conv
is that matmul over its pixels; any other NHWC conv (:func:`conv_primfunc`) sums the same
micro-kernel over its taps, each an offset into zero-padded phase images of the input (one per
stride phase: a strided read becomes a stride-1 one), channels padded to 32s.

Why: an AMX server core's ``vdpbf16ps`` runs at half its float32 FMA rate (``cpu_speed``), so
without tiles bfloat16 was no faster than float32, while OpenVINO's bfloat16 uses them: on the
Sapphire-Rapids-class VM this was written on, BERT-base bf16 took 84.9 ms against OpenVINO's
22.6, ResNet-50 31.1 against 6.9. A 128 × 768 × 768 product takes 0.15 ms on two cores here
(~1 TFLOP/s), numpy's float32 0.64. With them (``cpu_speed.py``, 2 threads): BERT-base bf16 84.9 →
28.0 ms; ResNet-50 bf16 31.1 → 24.4 ms (1×1 convs) → 16.1 ms (3×3 convs too; float32 29.7) →
kernel sum 12.1 ms with the strided convs.

When: the target has AMX-BF16 and AMX-TILE (``-mattr`` from the host's flags when the VM's model
number hides them: ``_tvm.host_feature_corrections``), the inputs are bfloat16 accumulated in
float32, and there are at least 32 rows (a tail block is moved back to end at the last row: rows
computed twice, equal); a matmul's ``K`` a multiple of 32, a conv's input channels at least 16.
Fewer rows (a decode step's one) stay on the vector kernels, which the weights' memory traffic
bounds either way; so does a 3-channel stem (tiles would compute 32 channels).

Linux hands a process the AMX state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``; without it the first tile instruction is SIGILL): the micro-kernel makes
that system call itself, once per loaded library, so the exported ``.so`` runs in any process.

Numerics: ``tdpbf16ps`` adds each pair's products in float32 with round-to-nearest-even and
treats bfloat16 denormal inputs as zero — rounding-level differences from a sequential sum, as
``vdpbf16ps``.
"""

# TVMScript buffer annotations are calls, which mypy rejects.
# mypy: disable-error-code="valid-type"
from __future__ import annotations

from typing import Any

#: Rows and columns of the output block one micro-kernel call computes (2 × 2 tiles of 16 × 16).
BLOCK = 32
#: ``K`` per step: one A tile row holds 32 bfloat16 (64 bytes).
DEPTH = 32
_FUNCTION = "amptool_amx_bf16_32x32"
#: Asks Linux for the tile state (once per library) and loads the tile configuration: once per
#: parallel task, before its blocks (the configuration is per thread, and every kernel here uses one).
_CONFIGURE = "amptool_amx_configure"
_SYS_ARCH_PRCTL = 158
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

#: ``C[32, 32] = Σ_taps A_tap[32, K] · B_tap`` — a matmul is one tap; a conv's taps are the kernel's
#: (row, column) offsets into a zero-padded image, ``A_t = a + offsets[t]`` bytes. ``ldc``/``lda``:
#: the row strides of C and A in bytes; ``ldb``: the bytes from one 16-column weight block to the
#: next; ``steps``: K / 32 per tap (B runs on through the taps). Tiles 0-3 hold C, 4-5 A, 6-7 B,
#: all 16 rows × 64 bytes (palette 1): one configuration serves every call.
LLVM_IR = f"""
@amptool_amx_permitted = internal global i32 0
declare i64 @syscall(i64, ...)
declare void @llvm.x86.ldtilecfg(ptr)
declare void @llvm.x86.tilezero(i8)
declare void @llvm.x86.tileloadd64(i8, ptr, i64)
declare void @llvm.x86.tdpbf16ps(i8, i8, i8)
declare void @llvm.x86.tilestored64(i8, ptr, i64)
define void @{_CONFIGURE}() alwaysinline {{
entry:
  %config = alloca [64 x i8], align 64
  %permitted = load i32, ptr @amptool_amx_permitted
  %known = icmp ne i32 %permitted, 0
  br i1 %known, label %configure, label %request
request:
  %ignored = call i64 (i64, ...) @syscall(i64 {_SYS_ARCH_PRCTL}, i64 {_ARCH_REQ_XCOMP_PERM}, i64 {_XFEATURE_XTILEDATA})
  store i32 1, ptr @amptool_amx_permitted
  br label %configure
configure:
  store <4 x i128> zeroinitializer, ptr %config, align 64
  store i8 1, ptr %config
  %colsb = getelementptr i8, ptr %config, i64 16
  store <8 x i16> <i16 64, i16 64, i16 64, i16 64, i16 64, i16 64, i16 64, i16 64>, ptr %colsb
  %rows = getelementptr i8, ptr %config, i64 48
  store <8 x i8> <i8 16, i8 16, i8 16, i8 16, i8 16, i8 16, i8 16, i8 16>, ptr %rows
  call void @llvm.x86.ldtilecfg(ptr %config)
  ret void
}}
define void @{_FUNCTION}(ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, i64 %steps, ptr %offsets,
                         i64 %taps) alwaysinline {{
entry:
  call void @llvm.x86.tilezero(i8 0)
  call void @llvm.x86.tilezero(i8 1)
  call void @llvm.x86.tilezero(i8 2)
  call void @llvm.x86.tilezero(i8 3)
  %a16 = mul i64 %lda, 16
  %b1 = getelementptr i8, ptr %b, i64 %ldb
  br label %tap
tap:
  %t = phi i64 [0, %entry], [%next_tap, %tap_done]
  %t_at = getelementptr i64, ptr %offsets, i64 %t
  %t_offset = load i64, ptr %t_at
  %a0 = getelementptr i8, ptr %a, i64 %t_offset
  %a1 = getelementptr i8, ptr %a0, i64 %a16
  %t_steps = mul i64 %t, %steps
  br label %step
step:
  %s = phi i64 [0, %tap], [%next, %step]
  %aoff = mul i64 %s, 64
  %k = add i64 %t_steps, %s
  %boff = mul i64 %k, 1024
  %pa0 = getelementptr i8, ptr %a0, i64 %aoff
  %pa1 = getelementptr i8, ptr %a1, i64 %aoff
  %pb0 = getelementptr i8, ptr %b, i64 %boff
  %pb1 = getelementptr i8, ptr %b1, i64 %boff
  call void @llvm.x86.tileloadd64(i8 4, ptr %pa0, i64 %lda)
  call void @llvm.x86.tileloadd64(i8 5, ptr %pa1, i64 %lda)
  call void @llvm.x86.tileloadd64(i8 6, ptr %pb0, i64 64)
  call void @llvm.x86.tileloadd64(i8 7, ptr %pb1, i64 64)
  call void @llvm.x86.tdpbf16ps(i8 0, i8 4, i8 6)
  call void @llvm.x86.tdpbf16ps(i8 1, i8 4, i8 7)
  call void @llvm.x86.tdpbf16ps(i8 2, i8 5, i8 6)
  call void @llvm.x86.tdpbf16ps(i8 3, i8 5, i8 7)
  %next = add i64 %s, 1
  %done = icmp eq i64 %next, %steps
  br i1 %done, label %tap_done, label %step
tap_done:
  %next_tap = add i64 %t, 1
  %all = icmp eq i64 %next_tap, %taps
  br i1 %all, label %store, label %tap
store:
  %c16 = mul i64 %ldc, 16
  %c1 = getelementptr i8, ptr %c, i64 64
  %c2 = getelementptr i8, ptr %c, i64 %c16
  %c3 = getelementptr i8, ptr %c2, i64 64
  call void @llvm.x86.tilestored64(i8 0, ptr %c, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 1, ptr %c1, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 2, ptr %c2, i64 %ldc)
  call void @llvm.x86.tilestored64(i8 3, ptr %c3, i64 %ldc)
  ret void
}}
"""


def has_amx_bf16(target: Any) -> bool:
    """Whether ``target`` (an LLVM Target) has AMX tiles with bfloat16 products."""
    from tvm.target.codegen import target_has_features  # noqa: PLC0415

    try:
        return bool(target_has_features("amx-bf16", target)) and bool(target_has_features("amx-tile", target))
    except Exception:  # noqa: BLE001 - not an x86 target
        return False


def fits(rows: int, k: int) -> bool:
    """Whether a ``[rows, k]`` bfloat16 left operand suits the micro-kernel (see the module doc)."""
    return rows >= BLOCK and k % DEPTH == 0 and k > 0


def pack_weight(bits: Any) -> Any:
    """``[K, N]`` bfloat16 bit patterns (uint16) → ``[N'/16, K/2, 16, 2]``, ``N'`` the columns padded
    with zeros to a multiple of 32."""
    import numpy as np  # noqa: PLC0415

    k, n = bits.shape
    padded = np.zeros((k, -(-n // BLOCK) * BLOCK), dtype=np.uint16)
    padded[:, :n] = bits
    return np.ascontiguousarray(padded.reshape(k // 2, 2, padded.shape[1] // 16, 16).transpose(2, 0, 3, 1))


def matmul_primfunc(lead: tuple[int, ...], k: int, n: int) -> Any:
    """The PrimFunc ``(A [*lead, k] bfloat16, B packed uint16) → C [*lead, n] float32``, the
    leading axes taken as one of rows: one parallel task per 32 × 32 block; the last row block ends
    at the last row, the last column block, when ``n`` is no multiple of 32, goes through a local
    tile and only its real columns are copied."""
    import math  # noqa: PLC0415

    from tvm.script import tirx as T  # noqa: PLC0415

    rows = math.prod(lead)
    row_blocks = -(-rows // BLOCK)
    col_blocks = -(-n // BLOCK)
    full_cols = n // BLOCK
    pairs = k // 2
    ldb = pairs * 16 * 2 * 2  # bytes of one 16-column block of B
    steps = k // DEPTH
    # The larger operand is walked once: a weight wider than the rows are many (BERT's 128 × 3072)
    # column block by column block, each read once; many rows by a narrow weight (ResNet's first
    # 1×1 convs: 3136 × 256) row block by row block, the output written in whole rows
    # ([3136, 64] · [64, 256] 0.36 → 0.15 ms).
    # A task is a strip (the tile configuration loaded once for it): a column block over every row
    # block, or a row block over every column block; block (task, inner) is at row block
    # ``task·rt + inner·ri``, column block ``task·ct + inner·ci``.
    by_columns = n >= rows
    tasks, inner_blocks = (col_blocks, row_blocks) if by_columns else (row_blocks, col_blocks)
    rt, ri, ct, ci = (0, 1, 1, 0) if by_columns else (1, 0, 0, 1)

    @T.prim_func(private=True)
    def amx_matmul(x: T.Buffer((*lead, k), "bfloat16"), b: T.Buffer((col_blocks * 2, pairs, 16, 2), "uint16"),
                   y: T.Buffer((*lead, n), "float32")) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        # TVM's bfloat16 legalization retypes ``x``'s pointer to float32 in ``access_ptr``; its bits
        # are what the tiles load, so they are addressed through a uint16 view of the same data.
        bits = T.decl_buffer((rows, k), "uint16", data=x.data)
        c = T.decl_buffer((rows, n), "float32", data=y.data)
        for task in T.parallel(tasks):
            with T.attr(0, "pragma_import_llvm", LLVM_IR):
                origin = T.decl_buffer((1,), "int64", scope="local")
                origin[0] = T.int64(0)
                T.evaluate(T.call_extern("void", _CONFIGURE))
                for inner in T.serial(inner_blocks):
                    row = T.min((task * rt + inner * ri) * BLOCK, rows - BLOCK)
                    col = task * ct + inner * ci
                    if col < full_cols:
                        T.evaluate(T.call_extern(
                            "void", _FUNCTION, c.access_ptr("w", offset=row * n + col * BLOCK), T.int64(n * 4),
                            bits.access_ptr("r", offset=row * k), T.int64(k * 2),
                            b.access_ptr("r", offset=col * 2 * pairs * 32), T.int64(ldb), T.int64(steps),
                            origin.access_ptr("r"), T.int64(1)))
                    else:
                        tile = T.alloc_buffer((BLOCK, BLOCK), "float32", scope="local")
                        T.evaluate(T.call_extern(
                            "void", _FUNCTION, tile.access_ptr("w"), T.int64(BLOCK * 4),
                            bits.access_ptr("r", offset=row * k), T.int64(k * 2),
                            b.access_ptr("r", offset=col * 2 * pairs * 32), T.int64(ldb), T.int64(steps),
                            origin.access_ptr("r"), T.int64(1)))
                        for r, j in T.grid(BLOCK, n - full_cols * BLOCK):
                            c[row + r, full_cols * BLOCK + j] = tile[r, j]

    return amx_matmul


def emit_matmul(bb: Any, x: Any, lead: tuple[int, ...], weight_bits: Any) -> Any:
    """The call of :func:`matmul_primfunc` on ``x`` (``[*lead, K]`` bfloat16) and a constant weight
    given as its ``[K, N]`` bfloat16 bit patterns; float32 ``[*lead, N]``. Opaque to FuseOps: the
    kernel is hand-written, no schedule could take a fused epilogue."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    k, n = weight_bits.shape
    gvar = bb.add_func(matmul_primfunc(lead, k, n), "amx_matmul")
    packed = relax.const(tvm.runtime.tensor(pack_weight(weight_bits)))
    return relax.call_tir(gvar, [x, packed], relax.TensorType([*lead, n], "float32"))


def conv_fits(data_shape: tuple[int, ...], out_channels: int, kernel: tuple[int, int], strides: list[int],
              padding: list[int], dilation: list[int]) -> bool:
    """Whether an NHWC conv suits :func:`conv_primfunc`: an output of at least a block of rows at
    the phase images' width."""
    geometry = _ConvGeometry(tuple(data_shape), kernel, strides, padding, dilation)
    return out_channels > 0 and geometry.out_h > 0 and geometry.out_w > 0 and geometry.rows >= BLOCK


class _ConvGeometry:
    """Sizes and taps of a conv over phase images: a stride-(sh, sw) conv reads, for each tap, one
    of the sh·sw images of every sh-th row and sw-th column of the padded input (its phase), at an
    offset of whole rows and columns — a stride-1 read, one row stride for the whole output.

    A tap is a 32-deep slice of ``K``: its offset into the phase images and, for each of its 32
    rows of weights, the (input channel, kernel row, kernel column) it multiplies, or None (zero).
    With 16 channels or more a tap is one kernel position and its channels padded to 32s. With
    fewer (an RGB stem) a tap's 32 values are consecutive pixels of one phase row — 10 pixels of 3
    channels — so one tap covers up to ``32 // C`` kernel columns: ResNet-50's 7×7 stride-2 stem
    is 14 taps, not 49 of 3 channels padded to 32."""

    def __init__(self, data_shape: tuple[int, ...], kernel: tuple[int, int], strides: list[int], padding: list[int],
                 dilation: list[int]) -> None:
        self.batch, self.height, self.width, self.channels = data_shape
        self.kh, self.kw = kernel
        self.sh, self.sw = strides
        self.top, self.left, bottom, right = padding
        self.dh, self.dw = dilation
        padded_h, padded_w = self.height + self.top + bottom, self.width + self.left + right
        self.out_h = (padded_h - (self.kh - 1) * self.dh - 1) // self.sh + 1
        self.out_w = (padded_w - (self.kw - 1) * self.dw - 1) // self.sw + 1
        self.merged = self.channels < DEPTH // 2
        # Values per pixel in the phase images: channels padded with zeros to 32-deep steps, or as
        # they are when a tap spans pixels.
        self.depth = self.channels if self.merged else -(-self.channels // DEPTH) * DEPTH
        self.phase_h, self.phase_w = -(-padded_h // self.sh), -(-padded_w // self.sw)
        # Zero rows after each phase image: one for the last taps' reach past the output's width,
        # and a merged tap's 32 values past the last pixel.
        self.spare = 1 + (-(-DEPTH // (self.phase_w * self.depth)) if self.merged else 0)
        self.plane = (self.phase_h + self.spare) * self.phase_w * self.depth
        self.image = self.sh * self.sw * self.plane
        self.rows = self.out_h * self.phase_w  # output pixels at the phase width: p = oh · Wq + ow
        # Phase rows (columns) some tap reads, when they are the first few (a 1×1 stride-2 conv
        # reads phase 0 only): the others are left unwritten.
        self.used_h = _leading_phases(self.kh, self.dh, self.sh)
        self.used_w = _leading_phases(self.kw, self.dw, self.sw)

    def _offset(self, down: int, phase_col: int, pixel: int) -> int:
        """Elements from an output pixel's phase position to kernel row offset ``down`` (input rows),
        phase column ``phase_col`` and ``pixel`` phase pixels along."""
        phase = (down % self.sh) * self.sw + phase_col
        return phase * self.plane + (down // self.sh * self.phase_w + pixel) * self.depth

    def taps(self) -> list[tuple[int, list[tuple[int, int, int] | None]]]:
        found: list[tuple[int, list[tuple[int, int, int] | None]]] = []
        for i in range(self.kh):
            down = i * self.dh
            if not self.merged:
                for j in range(self.kw):
                    across = j * self.dw
                    rows = [(c, i, j) if c < self.channels else None for c in range(self.depth)]
                    found += [(self._offset(down, across % self.sw, across // self.sw) + step * DEPTH,
                               rows[step * DEPTH:(step + 1) * DEPTH]) for step in range(self.depth // DEPTH)]
                continue
            window = DEPTH // self.channels
            for phase_col in range(self.sw):
                columns = {j * self.dw // self.sw: j for j in range(self.kw) if j * self.dw % self.sw == phase_col}
                for first in range(0, max(columns, default=-1) + 1, window):
                    rows = [(c, i, columns[first + p]) if p < window and first + p in columns else None
                            for p, c in (divmod(k, self.channels) for k in range(DEPTH))]
                    if any(rows):
                        found.append((self._offset(down, phase_col, first), rows))
        return found


def _leading_phases(taps: int, dilation: int, stride: int) -> int:
    """``n`` when the taps read phases 0..n-1 exactly, else ``stride`` (all)."""
    used = {tap * dilation % stride for tap in range(taps)}
    return len(used) if used == set(range(len(used))) else stride


def pack_conv_weight(bits: Any, taps: list[tuple[int, list[tuple[int, int, int] | None]]]) -> Any:
    """An OIHW weight's bfloat16 bit patterns as :func:`pack_weight` of ``[32·taps, OC]``: each
    tap's 32 rows the weights its values multiply (zeros for padding)."""
    import numpy as np  # noqa: PLC0415

    rows = [where for _, wheres in taps for where in wheres]
    matrix = np.zeros((len(rows), bits.shape[0]), dtype=np.uint16)
    for k, where in enumerate(rows):
        if where is not None:
            matrix[k] = bits[:, where[0], where[1], where[2]]
    return pack_weight(matrix)


def conv_primfunc(data_shape: tuple[int, ...], out_channels: int, kernel: tuple[int, int], strides: list[int],
                  padding: list[int], dilation: list[int]) -> Any:
    """An NHWC conv ``(X bfloat16, W packed, tap offsets int64) → Y float32`` as taps of the
    micro-kernel.

    The input is copied once into zero-padded phase images (:class:`_ConvGeometry`; one image for
    stride 1); the output is computed over the phase width — pixel ``p = oh · Wq + ow`` reads
    phase pixel ``p`` plus the tap's offset, so each tile is a plain strided load — and only the
    ``ow < OW`` pixels of each 32 × 32 block are copied out (the padding columns' products are the
    waste: 2/58 of a 3×3 conv at 56 columns, 2/9 at 7)."""
    from tvm.script import tirx as T  # noqa: PLC0415

    g = _ConvGeometry(tuple(data_shape), kernel, strides, padding, dilation)
    batch, height, width, channels, depth = g.batch, g.height, g.width, g.channels, g.depth
    out_h, out_w, phase_h, phase_w, image = g.out_h, g.out_w, g.phase_h, g.phase_w, g.image
    sh, sw, top, left, rows, spare = g.sh, g.sw, g.top, g.left, g.rows, g.spare
    used_h, used_w = g.used_h, g.used_w
    phase_rows = phase_h + spare
    row_blocks = -(-rows // BLOCK)
    col_blocks = -(-out_channels // BLOCK)
    taps = len(g.taps())
    pairs = taps * DEPTH // 2
    ldb = pairs * 16 * 2 * 2
    # Strips as the matmul's: a column block over every (image, row block), or the other way.
    by_columns = out_channels >= batch * rows
    tasks, inner_blocks = (col_blocks, batch * row_blocks) if by_columns else (batch * row_blocks, col_blocks)
    pt, pi, ct, ci = (0, 1, 1, 0) if by_columns else (1, 0, 0, 1)

    @T.prim_func(private=True)
    def amx_conv(x: T.Buffer((batch, height, width, channels), "bfloat16"),
                 b: T.Buffer((col_blocks * 2, pairs, 16, 2), "uint16"), where: T.Buffer((taps,), "int64"),
                 y: T.Buffer((batch, out_h, out_w, out_channels), "float32")) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        bits = T.decl_buffer((batch, height, width, channels), "uint16", data=x.data)
        phases = T.decl_buffer((batch * image,), "uint16")
        # One task per phase image row: (image, phase row, phase column, row); whole pixels copied.
        for task in T.parallel(batch * sh * sw * phase_rows):
            if task // phase_rows // sw % sh < used_h and task // phase_rows % sw < used_w:
                for wq in T.serial(phase_w):
                    base = (task * phase_w + wq) * depth
                    src_h = task % phase_rows * sh + task // phase_rows // sw % sh - top
                    src_w = wq * sw + task // phase_rows % sw - left
                    if src_h >= 0 and src_h < height and src_w >= 0 and src_w < width:
                        for c in T.serial(channels):
                            phases[base + c] = bits[task // (phase_rows * sh * sw), src_h, src_w, c]
                    else:
                        for c in T.serial(channels):
                            phases[base + c] = T.uint16(0)
                    for c in T.serial(depth - channels):
                        phases[base + channels + c] = T.uint16(0)
        for task in T.parallel(tasks):
            with T.attr(0, "pragma_import_llvm", LLVM_IR):
                tile = T.decl_buffer((BLOCK, BLOCK), "float32", scope="local")
                T.evaluate(T.call_extern("void", _CONFIGURE))
                for inner in T.serial(inner_blocks):
                    col = task * ct + inner * ci
                    pixels = task * pt + inner * pi  # (image, row block)
                    n = pixels // row_blocks
                    row = T.min(pixels % row_blocks * BLOCK, rows - BLOCK)
                    T.evaluate(T.call_extern(
                        "void", _FUNCTION, tile.access_ptr("w"), T.int64(BLOCK * 4),
                        phases.access_ptr("r", offset=n * image + row * depth), T.int64(depth * 2),
                        b.access_ptr("r", offset=col * 2 * pairs * 32), T.int64(ldb), T.int64(1),
                        where.access_ptr("r"), T.int64(taps)))
                    for r in T.serial(BLOCK):
                        if (row + r) % phase_w < out_w:
                            for j in T.serial(T.min(BLOCK, out_channels - col * BLOCK)):
                                y[n, (row + r) // phase_w, (row + r) % phase_w, col * BLOCK + j] = tile[r, j]

    return amx_conv


def emit_conv(bb: Any, x: Any, data_shape: tuple[int, ...], weight_bits: Any, strides: list[int],
              padding: list[int], dilation: list[int]) -> Any:
    """The call of :func:`conv_primfunc` on NHWC ``x`` and an OIHW weight's bfloat16 bit patterns."""
    import numpy as np  # noqa: PLC0415
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    out_channels, _, kh, kw = weight_bits.shape
    g = _ConvGeometry(tuple(data_shape), (kh, kw), strides, padding, dilation)
    taps = g.taps()
    gvar = bb.add_func(conv_primfunc(data_shape, out_channels, (kh, kw), strides, padding, dilation), "amx_conv")
    packed = relax.const(tvm.runtime.tensor(pack_conv_weight(weight_bits, taps)))
    offsets = relax.const(tvm.runtime.tensor(np.array([2 * offset for offset, _ in taps], dtype=np.int64)))
    return relax.call_tir(gvar, [x, packed, offsets],
                          relax.TensorType([g.batch, g.out_h, g.out_w, out_channels], "float32"))
