"""benchmarks/layout_probe.py runs, and refuses to time two kernels that compute different things."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm")

PROBE = Path(__file__).resolve().parent.parent / "benchmarks" / "layout_probe.py"
SMALL = ["--in", "16", "--out", "32", "--size", "14", "--kernel", "3", "--calls", "2"]


def _probe(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The probe's module globals (its ``main`` not yet run), argv set to a small conv."""
    monkeypatch.setattr(sys, "argv", [str(PROBE), *SMALL])
    return runpy.run_path(str(PROBE), run_name="layout_probe")


def test_the_probe_times_both_layouts(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _probe(monkeypatch)["main"]()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[6] for line in lines] == ["nhwc", "nchw16c"]


def test_the_probe_checks_both_kernels_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The blocked weights with two taps swapped: the check stops the probe before any timing."""
    probe = _probe(monkeypatch)
    operands = probe["_operands"]

    def swapped(*args: int) -> dict[str, list[np.ndarray]]:
        values = operands(*args)
        values["nchw16c"][1] = np.ascontiguousarray(values["nchw16c"][1].transpose(0, 1, 3, 2, 4, 5))
        return values

    monkeypatch.setitem(probe["main"].__globals__, "_operands", swapped)
    with pytest.raises(AssertionError):
        probe["main"]()
