"""NHWC against NCHW16c for one conv, both compiled by TVM with the same register tile: is a blocked
activation layout worth changing the CPU pipeline for?

    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/layout_probe.py                    # 3×3, 64 → 64, 56²
    TVM_NUM_THREADS=2 .venv/bin/python benchmarks/layout_probe.py --in 256 --out 64 --size 28 --kernel 1

Both variants: a pre-padded input, 2 output vectors (32 channels) × 14 columns per tile, the tile's
reduction over taps and input channels in the same order, rows in parallel, no epilogue. Only the
layout differs: NHWC puts a tile's 14 columns a whole channel count apart (1 KB at 256 channels),
NCHW16c puts them 64 bytes apart. The calls alternate in one process, an 8 MB buffer touched before
each (the input arrives from memory, as in a network), after checking both give the same output;
minima are printed, and the NCHW16c minimum as a ratio of the NHWC one. A probe for the pipeline's
next step, not amptool's kernels (those add the padded-row copy and the fused epilogue).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tvm
from tvm import s_tir, te

TILE_COLUMNS = 14
TILE_CHANNELS = 32  # two AVX-512 vectors
LANES = 16


def _conv(layout: str, cin: int, cout: int, size: int, kernel: int) -> tuple[object, list[tuple[int, ...]]]:
    """The scheduled PrimFunc module of one conv in ``layout`` and its argument shapes."""
    padded = size + kernel - 1
    ry, rx = te.reduce_axis((0, kernel), "ry"), te.reduce_axis((0, kernel), "rx")
    if layout == "nhwc":
        shapes = [(1, padded, padded, cin), (cout // TILE_CHANNELS, kernel, kernel, cin, TILE_CHANNELS),
                  (1, size, size, cout)]
        data, weight = te.placeholder(shapes[0], name="data"), te.placeholder(shapes[1], name="w")
        rc = te.reduce_axis((0, cin), "rc")
        out = te.compute(shapes[2], lambda n, y, x, c: te.sum(
            data[n, y + ry, x + rx, rc] * weight[c // TILE_CHANNELS, ry, rx, rc, c % TILE_CHANNELS],
            axis=[ry, rx, rc]), name="conv")
    else:
        shapes = [(1, cin // LANES, padded, padded, LANES),
                  (cout // TILE_CHANNELS, cin // LANES, kernel, kernel, LANES, TILE_CHANNELS),
                  (1, cout // TILE_CHANNELS, size, size, TILE_CHANNELS)]
        data, weight = te.placeholder(shapes[0], name="data"), te.placeholder(shapes[1], name="w")
        rb, ri = te.reduce_axis((0, cin // LANES), "rb"), te.reduce_axis((0, LANES), "ri")
        out = te.compute(shapes[2], lambda n, ob, y, x, c: te.sum(
            data[n, rb, y + ry, x + rx, ri] * weight[ob, rb, ry, rx, ri, c], axis=[rb, ry, rx, ri]), name="conv")
    sch = s_tir.Schedule(te.create_prim_func([data, weight, out]))
    block = sch.get_sblock("conv")
    loops = sch.get_loops(block)
    if layout == "nhwc":
        n, y, x, c, *reductions = loops
        blocks, vectors, lanes = sch.split(c, [None, TILE_CHANNELS // LANES, LANES])
    else:
        n, blocks, y, x, c, *reductions = loops
        vectors, lanes = sch.split(c, [TILE_CHANNELS // LANES, LANES])
    xo, xi = sch.split(x, [None, TILE_COLUMNS])
    sch.reorder(n, y, blocks, xo, *reductions, xi, vectors, lanes)
    sch.unroll(xi)
    sch.unroll(vectors)
    sch.vectorize(lanes)
    sch.parallel(sch.fuse(n, y))
    init = sch.decompose_reduction(block, reductions[0])
    sch.vectorize(sch.get_loops(init)[-1])
    return sch.mod, shapes


def _operands(cin: int, cout: int, size: int, kernel: int) -> dict[str, list[np.ndarray]]:
    """Seeded input and weights in NHWC, and the same values in NCHW16c."""
    rng = np.random.default_rng(0)
    padded = size + kernel - 1
    data = rng.standard_normal((1, padded, padded, cin)).astype("float32")
    weight = rng.standard_normal((cout // TILE_CHANNELS, kernel, kernel, cin, TILE_CHANNELS)).astype("float32")
    blocked_data = data.reshape(1, padded, padded, cin // LANES, LANES).transpose(0, 3, 1, 2, 4)
    blocked_weight = weight.reshape(cout // TILE_CHANNELS, kernel, kernel, cin // LANES, LANES,
                                    TILE_CHANNELS).transpose(0, 3, 1, 2, 4, 5)
    blocked = [np.ascontiguousarray(blocked_data), np.ascontiguousarray(blocked_weight)]
    return {"nhwc": [data, weight], "nchw16c": blocked}


def _check_same_result(kernels: dict[str, tuple[object, list[object]]], size: int, cout: int) -> None:
    """Both kernels compute the same conv (a probe timing two different things would say nothing)."""
    outputs = {}
    for layout, (function, tensors) in kernels.items():
        function(*tensors)
        outputs[layout] = tensors[-1].numpy()
    blocked = outputs["nchw16c"].transpose(0, 2, 3, 1, 4).reshape(1, size, size, cout)
    np.testing.assert_allclose(blocked, outputs["nhwc"], rtol=1e-4, atol=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in", dest="cin", type=int, default=64)
    parser.add_argument("--out", dest="cout", type=int, default=64)
    parser.add_argument("--size", type=int, default=56, help="output rows = columns (a multiple of 14)")
    parser.add_argument("--kernel", type=int, default=3)
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--mcpu", default=str(tvm.target.codegen.llvm_get_system_cpu()),
                        help="LLVM CPU to compile for (default this host's, so the kernels run here)")
    args = parser.parse_args()
    if args.size % TILE_COLUMNS or args.cin % LANES or args.cout % TILE_CHANNELS:
        parser.error(f"--size must be a multiple of {TILE_COLUMNS}, --in of {LANES}, --out of {TILE_CHANNELS}")
    target = tvm.target.Target({"kind": "llvm", "mcpu": args.mcpu})
    values = _operands(args.cin, args.cout, args.size, args.kernel)
    kernels = {}
    for layout in ("nhwc", "nchw16c"):
        mod, shapes = _conv(layout, args.cin, args.cout, args.size, args.kernel)
        with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
            library = tvm.compile(mod, target=target)
        tensors = [tvm.runtime.tensor(v) for v in values[layout]] + [tvm.runtime.empty(shapes[2], "float32")]
        kernels[layout] = (library["main"], tensors)
    _check_same_result(kernels, args.size, args.cout)
    flush = np.ones(8 << 20, np.float32)
    times: dict[str, list[float]] = {layout: [] for layout in kernels}
    for _ in range(args.calls):
        for layout, (function, tensors) in kernels.items():
            flush += 1
            start = time.perf_counter()
            function(*tensors)
            times[layout].append(time.perf_counter() - start)
    base = min(times["nhwc"])
    for layout, values in times.items():
        ms = np.array(values) * 1e3
        print(f"{args.kernel}x{args.kernel} {args.cin} -> {args.cout} at {args.size}²  {layout:8s} "
              f"min {ms.min():.3f} ms  median {np.median(ms):.3f} ms  min / nhwc min {min(values) / base:.2f}")


if __name__ == "__main__":
    main()
