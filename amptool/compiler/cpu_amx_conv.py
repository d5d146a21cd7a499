"""AMX convs (:mod:`amptool.compiler.cpu_amx`'s micro-kernel): NHWC, any stride, dilation and
padding, each output through an :class:`~amptool.compiler.cpu_amx.Epilogue`.

What: the input is copied once into zero-padded phase images — one per stride phase, so a strided
read becomes a stride-1 one — and each tap (a 32-deep slice of ``K``) is an offset into them, passed
to the micro-kernel as data; output pixels are computed at the phase images' width (one row
stride per tap for the whole image) and only the real ones stored. A grouped conv (``groups``)
has phase images per image and group and its groups' column blocks in one parallel loop: one call,
no gather of each group's channels or concat of their outputs (RegNet bfloat16: the model 0.86×
its one-call-a-group build, 1.15× → 0.96× OpenVINO's bfloat16; 2 threads, an AMX VM). Why and
numerics: as the micro-kernel's (``cpu_amx``).
"""

# TVMScript buffer annotations are calls, which mypy rejects.
# mypy: disable-error-code="valid-type"
from __future__ import annotations

import functools
from typing import Any

from amptool.compiler.cpu_amx import (
    _CONFIGURE,
    _FUNCTION,
    BLOCK,
    DEPTH,
    LLVM_IR,
    PLAIN,
    Epilogue,
    pack_weight,
    parallel_workers,
    strips,
)


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
                  padding: list[int], dilation: list[int], epilogue: Epilogue = PLAIN, groups: int = 1) -> Any:
    """An NHWC conv ``(X bfloat16, W packed, tap offsets int64, bias, residual) → Y`` as taps of
    the micro-kernel, each output through ``epilogue``; with ``groups``, each group's channels a conv
    of their own in the same call (phase images per image and group, the group's weight columns).

    The input is copied once into zero-padded phase images (:class:`_ConvGeometry`; one image for
    stride 1); the output is computed over the phase width — pixel ``p = oh · Wq + ow`` reads
    phase pixel ``p`` plus the tap's offset, so each tile is a plain strided load — and only the
    ``ow < OW`` pixels of each 32 × 32 block are copied out (the padding columns' products are the
    waste: 2/58 of a 3×3 conv at 56 columns, 2/9 at 7)."""
    import math  # noqa: PLC0415

    from tvm.script import tirx as T  # noqa: PLC0415

    batch, height, width, channels = data_shape
    group_in, group_out = channels // groups, out_channels // groups
    g = _ConvGeometry((batch, height, width, group_in), kernel, strides, padding, dilation)
    depth = g.depth
    out_h, out_w, phase_h, phase_w, image = g.out_h, g.out_w, g.phase_h, g.phase_w, g.image
    sh, sw, top, left, rows, spare = g.sh, g.sw, g.top, g.left, g.rows, g.spare
    used_h, used_w = g.used_h, g.used_w
    phase_rows = phase_h + spare
    row_blocks = -(-rows // BLOCK)
    group_blocks = -(-group_out // BLOCK)  # a group's column blocks; its weight columns padded to them
    col_blocks = groups * group_blocks
    taps = len(g.taps())
    pairs = taps * DEPTH // 2
    ldb = pairs * 16 * 2 * 2
    bias_shape, residual_shape, residual_dtype = epilogue.shapes((batch, out_h, out_w, out_channels))
    residual_size = math.prod(residual_shape)
    tail = group_out % BLOCK  # channels of a group's last, partial block
    out_dtype = epilogue.dtype
    # Strips as the matmul's, the (image, row block) pairs its rows.
    tasks, inner_blocks, (pt, pi, ct, ci) = strips(batch * row_blocks, col_blocks,
                                                   by_columns=out_channels >= batch * rows)
    workers = parallel_workers(tasks)

    @T.prim_func(private=True)
    def amx_conv(x: T.Buffer((batch, height, width, channels), "bfloat16"),
                 b: T.Buffer((col_blocks * 2, pairs, 16, 2), "uint16"), where: T.Buffer((taps,), "int64"),
                 bias: T.Buffer(bias_shape, "float32"), residual: T.Buffer(residual_shape, residual_dtype),
                 y: T.Buffer((batch, out_h, out_w, out_channels), out_dtype)) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8})
        bits = T.decl_buffer((batch, height, width, channels), "uint16", data=x.data)
        phases = T.decl_buffer((batch * groups * image,), "uint16")
        flat = T.decl_buffer((residual_size,), residual_dtype, data=residual.data)
        out = T.decl_buffer((batch * out_h * out_w * out_channels,), out_dtype, data=y.data)
        # One task per phase image row: (image, group, phase row, phase column, row); whole pixels copied.
        for task in T.parallel(batch * groups * sh * sw * phase_rows):
            if task // phase_rows // sw % sh < used_h and task // phase_rows % sw < used_w:
                for wq in T.serial(phase_w):
                    base = (task * phase_w + wq) * depth
                    src_h = task % phase_rows * sh + task // phase_rows // sw % sh - top
                    src_w = wq * sw + task // phase_rows % sw - left
                    first = task // (phase_rows * sh * sw) % groups * group_in
                    if src_h >= 0 and src_h < height and src_w >= 0 and src_w < width:
                        for c in T.serial(group_in):
                            phases[base + c] = bits[task // (phase_rows * sh * sw * groups), src_h, src_w, first + c]
                    else:
                        for c in T.serial(group_in):
                            phases[base + c] = T.uint16(0)
                    for c in T.serial(depth - group_in):
                        phases[base + group_in + c] = T.uint16(0)
        for worker in T.parallel(workers):
            with T.attr(0, "pragma_import_llvm", LLVM_IR):
                tile = T.decl_buffer((BLOCK, BLOCK), "float32")  # 4 KB: kept on the stack (stack_tiles)
                T.evaluate(T.call_extern("void", _CONFIGURE, T.int64(DEPTH * 2), T.int64(DEPTH // 2)))
                for task in T.serial(worker * tasks // workers, (worker + 1) * tasks // workers):
                    for inner in T.serial(inner_blocks):
                        col = task * ct + inner * ci  # (group, column block)
                        pixels = task * pt + inner * pi  # (image, row block)
                        n = pixels // row_blocks
                        row = T.min(pixels % row_blocks * BLOCK, rows - BLOCK)
                        image_at = (n * groups + col // group_blocks) * image
                        channel = col // group_blocks * group_out + col % group_blocks * BLOCK
                        T.evaluate(T.call_extern(
                            "void", _FUNCTION, tile.access_ptr("w"), T.int64(BLOCK * 4),
                            phases.access_ptr("r", offset=image_at + row * depth), T.int64(depth * 2),
                            b.access_ptr("r", offset=col * 2 * pairs * 32), T.int64(ldb), T.int64(1),
                            where.access_ptr("r"), T.int64(taps)))
                        for r in T.serial(BLOCK):
                            if (row + r) % phase_w < out_w:
                                pixel = (n * out_h + (row + r) // phase_w) * out_w + (row + r) % phase_w
                                at = pixel * out_channels + channel
                                if tail == 0 or col % group_blocks * BLOCK + BLOCK <= group_out:  # no tail: one branch
                                    for j in T.vectorized(BLOCK):
                                        out[at + j] = epilogue.apply(tile[r, j], bias, channel + j, flat, at + j)
                                else:
                                    for j in T.vectorized(tail):
                                        out[at + j] = epilogue.apply(tile[r, j], bias, channel + j, flat, at + j)

    return amx_conv


@functools.lru_cache(maxsize=512)
def _conv_primfunc(data_shape: tuple[int, ...], out_channels: int, kernel: tuple[int, int], strides: tuple[int, ...],
                   padding: tuple[int, ...], dilation: tuple[int, ...], epilogue: Epilogue, groups: int) -> Any:
    """:func:`conv_primfunc`, built once per shape and epilogue: a network asks for the same conv in
    several blocks, and TVMScript takes ~0.1 s to build one."""
    return conv_primfunc(data_shape, out_channels, kernel, list(strides), list(padding), list(dilation), epilogue,
                         groups)


def emit_conv(bb: Any, x: Any, data_shape: tuple[int, ...], weight_bits: Any, strides: list[int],
              padding: list[int], dilation: list[int], epilogue: Epilogue = PLAIN, residual: Any = None,
              groups: int = 1) -> Any:
    """The call of :func:`conv_primfunc` on NHWC ``x`` and an OIHW weight's bfloat16 bit patterns
    (``[groups · out, in / groups, KH, KW]``): each group's weight packed on its own, the groups'
    column blocks one after another."""
    import numpy as np  # noqa: PLC0415
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    out_channels, group_in, kh, kw = weight_bits.shape
    g = _ConvGeometry((*data_shape[:3], group_in), (kh, kw), strides, padding, dilation)
    taps = g.taps()
    gvar = bb.add_func(_conv_primfunc(tuple(data_shape), out_channels, (kh, kw), tuple(strides), tuple(padding),
                                      tuple(dilation), epilogue, groups), "amx_conv")
    per_group = np.split(weight_bits, groups)
    packed = relax.const(tvm.runtime.tensor(np.concatenate([pack_conv_weight(w, taps) for w in per_group])))
    offsets = relax.const(tvm.runtime.tensor(np.array([2 * offset for offset, _ in taps], dtype=np.int64)))
    return relax.call_tir(gvar, [x, packed, offsets, *epilogue.arguments(residual)],
                          relax.TensorType([g.batch, g.out_h, g.out_w, out_channels], epilogue.dtype))
