"""How fast each conv register tile shape runs on this core: the evidence behind
``amptool.compiler.cpu_kernels.LOADS_PER_FMA`` (which tile ``tile_vectors`` picks).

Each tile — C output columns × V vectors of output channels (16 with AVX-512, 8 with AVX2), one
broadcast input per column and one weight vector per channel vector per reduction step — is written
out in C with intrinsics, compiled with ``gcc -O3 -march=native``, and run over a reduction of
``--depth`` steps (a 3×3 × 64-channel conv's 576 by default: the weight panel comes from L2, the
inputs from L1). All tiles run alternated in one process, ``--rounds`` times; the table gives each
tile's best GFLOP/s, its loads per FMA (1/V + 1/C) and its speed relative to the first tile of the
ISA's list. Tiles that need more vector registers than the ISA has (32 zmm, 16 ymm) are in the
table too: the compiler spills.

    .venv/bin/python benchmarks/register_tiles.py                 # AVX-512 where the CPU has it, else AVX2
    .venv/bin/python benchmarks/register_tiles.py --isa avx2 --depth 1024 --rounds 9

Needs gcc and an x86-64 CPU with the ISA (exits 2 with a line saying so otherwise). Not a test: timings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Isa:
    """What the C source needs of one vector ISA, and the tiles timed on it (the first is the
    baseline of the ratios)."""

    lanes: int
    registers: int
    vector: str  # the C type
    prefix: str  # of the intrinsics
    cpu_flag: str  # as /proc/cpuinfo spells it
    tiles: tuple[tuple[int, int], ...]


ISAS = {
    "avx512": Isa(16, 32, "__m512", "_mm512", "avx512f",
                  ((14, 2), (12, 2), (7, 2), (16, 1), (14, 1), (2, 4), (3, 4), (4, 4), (5, 4), (6, 4), (8, 3), (9, 3),
                   (7, 4))),
    # 4 × 2 is what ResNet-50's 56-column rows took on AVX2 before the seventeenth session's probe.
    "avx2": Isa(8, 16, "__m256", "_mm256", "avx2",
                ((4, 2), (6, 2), (7, 2), (8, 1), (12, 1), (14, 1), (2, 3), (3, 3), (4, 3), (2, 4), (3, 4))),
}


def tile_source(columns: int, vectors: int, isa: Isa) -> str:
    """One tile as a C function ``t{C}x{V}(X, xs, W, K, out)``: accumulators in registers."""
    acc = [f"a{c}_{v}" for c in range(columns) for v in range(vectors)]
    lines = [f"__attribute__((noinline)) void t{columns}x{vectors}(const float*X, long xs, const float*W, long K,"
             " float*out){",
             *(f" {isa.vector} {a}={isa.prefix}_setzero_ps();" for a in acc),
             " for(long k=0;k<K;k++){",
             *(f"  {isa.vector} w{v}={isa.prefix}_load_ps(W+k*{isa.lanes * vectors}+{isa.lanes * v});"
               for v in range(vectors))]
    for c in range(columns):
        lines.append(f"  {{{isa.vector} b={isa.prefix}_set1_ps(X[{c}*xs+k]);")
        lines += [f"  a{c}_{v}={isa.prefix}_fmadd_ps(b,w{v},a{c}_{v});" for v in range(vectors)]
        lines.append("  }")
    lines.append(" }")
    lines += [f" {isa.prefix}_storeu_ps(out+{c * 64 + v * isa.lanes},a{c}_{v});"
              for c in range(columns) for v in range(vectors)]
    return "\n".join([*lines, "}"])


def program(isa: Isa) -> str:
    """The whole C program: every tile, then a main that times them alternated and prints
    ``COLUMNSxVECTORS GFLOPS`` lines (same FMA count per call for every tile)."""
    names = [f"t{c}x{v}" for c, v in isa.tiles]
    table = ",".join(f"{{{n},{c},{v}}}" for n, (c, v) in zip(names, isa.tiles, strict=True))
    return "\n".join([
        "#include <immintrin.h>", "#include <stdio.h>", "#include <stdlib.h>", "#include <time.h>",
        "static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}",
        *(tile_source(c, v, isa) for c, v in isa.tiles),
        "typedef void(*F)(const float*,long,const float*,long,float*);",
        "int main(int argc,char**argv){long K=atol(argv[1]),reps=atol(argv[2]);int rounds=atoi(argv[3]);long xs=K;",
        " float*X=aligned_alloc(64,4*(32*xs+64));float*W=aligned_alloc(64,4*K*64);static float o[32*64];",
        " for(long i=0;i<32*xs+64;i++)X[i]=1e-3f*(i%7);for(long i=0;i<K*64;i++)W[i]=1e-3f*(i%5);",
        f" struct{{F f;int c,v;}}fs[]={{{table}}};int n={len(isa.tiles)};double best[{len(isa.tiles)}];",
        " for(int j=0;j<n;j++)best[j]=1e9;",
        " for(int r=0;r<rounds;r++)for(int j=0;j<n;j++){long calls=reps*48/(fs[j].c*fs[j].v);double t=now();",
        "  for(long i=0;i<calls;i++)fs[j].f(X,xs,W,K,o);t=(now()-t)/calls;if(t<best[j])best[j]=t;}",
        " for(int j=0;j<n;j++)printf(\"%dx%d %.3f\\n\",fs[j].c,fs[j].v,"
        f"2.0*{isa.lanes}*fs[j].c*fs[j].v*K/best[j]/1e9);",
        " return (int)o[3];}",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=576, help="reduction steps per tile (default 576: 3×3 × 64)")
    parser.add_argument("--reps", type=int, default=2000, help="calls of a 48-accumulator tile per round")
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds; the best of each tile counts")
    parser.add_argument("--isa", choices=sorted(ISAS), help="default: avx512 where the CPU has it, else avx2")
    args = parser.parse_args()
    compiler = shutil.which("gcc")
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = handle.read()
    name = args.isa or ("avx512" if f" {ISAS['avx512'].cpu_flag}" in flags else "avx2")
    isa = ISAS[name]
    if compiler is None or f" {isa.cpu_flag}" not in flags:
        print(f"register_tiles.py --isa {name} needs gcc and a CPU with {isa.cpu_flag} (x86-64 Linux)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="amptool-tiles-") as work:
        source, binary = os.path.join(work, "tiles.c"), os.path.join(work, "tiles")
        with open(source, "w", encoding="utf-8") as handle:
            handle.write(program(isa))
        subprocess.run([compiler, "-O3", "-march=native", source, "-o", binary], check=True)
        out = subprocess.run([binary, str(args.depth), str(args.reps), str(args.rounds)], check=True,
                             capture_output=True, text=True).stdout
    speed = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}
    first = isa.tiles[0]
    base = speed[f"{first[0]}x{first[1]}"]
    print(f"Register tiles ({name}, {isa.lanes} lanes), reduction depth {args.depth}, best of {args.rounds} "
          "alternated rounds (one thread)\n")
    print(f"| tile (columns × vectors) | loads per FMA | GFLOP/s | vs {first[0]} × {first[1]} |")
    print("|---|---:|---:|---:|")
    for columns, vectors in sorted(isa.tiles, key=lambda t: -(1 / t[1] + 1 / t[0])):
        label = f"{columns}x{vectors}"
        spill = " (spills)" if columns * vectors + vectors + 1 > isa.registers else ""
        print(f"| {columns} × {vectors}{spill} | {1 / vectors + 1 / columns:.2f} | {speed[label]:.0f} | "
              f"{speed[label] / base:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
