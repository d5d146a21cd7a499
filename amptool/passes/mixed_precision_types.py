"""The plain data of the mixed-precision pass: what it decides per binding (``Decision``),
what it reports (``MixedPrecisionReport``) and which ops it reads as constants
(``CREATION_OPS``).

Apart from the mutator (mixed_precision_mutator.py, which imports TVM) so that the pass's
readers — inspect, probe, stats — use these without importing TVM. Import them from
``amptool.passes.mixed_precision``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import NamedTuple

from amptool.colors.policy import Color
from amptool.passes.range_guards import Guarded

#: Ops that make a tensor from attributes (and, for ``full``, a fill value) alone. A float32
#: result of one is as castable as a constant when its fill is (zeros, ones and eye always
#: are): FOLLOW consumers go low and read a cast of it, as they would a weight's. Without
#: this, a ``zeros`` too large for FoldConstant (ConcretizeLike makes them from Shrink,
#: ConstantOfShape) kept every consumer in float32.
CREATION_OPS = frozenset({"relax.zeros", "relax.ones", "relax.eye", "relax.full"})


class Decision(NamedTuple):
    """The colour and compute dtype chosen for one binding (for inspect and reports).

    A NamedTuple, not a frozen dataclass: one is made per binding, and a frozen
    dataclass's ``__init__`` costs ~1 µs more."""

    var: str
    node: str | None
    onnx_op: str | None
    relax_op: str
    color: Color
    dtype: str


@dataclass
class MixedPrecisionReport:
    dtype: str
    casts_inserted: int = 0
    weight_casts: int = 0
    unknown_ops: dict[str, int] = field(default_factory=collections.Counter)
    guarded: list[Guarded] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)

    @property
    def converted(self) -> int:
        return sum(1 for d in self.decisions if d.dtype == self.dtype)
