"""Run a compiled amptool module (in memory or from an artifact directory)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from amptool import _tvm


@dataclass
class CompiledModel:
    """A loaded VM plus the input/output names it was built for."""

    vm: Any
    input_names: Sequence[str]
    output_names: Sequence[str]
    device: str = "cpu"

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = _tvm.run_vm(self.vm, [feeds[n] for n in self.input_names], self.device)
        if len(outputs) != len(self.output_names):
            raise RuntimeError(
                f"compiled module returned {len(outputs)} outputs, expected {len(self.output_names)}"
            )
        return dict(zip(self.output_names, outputs))
