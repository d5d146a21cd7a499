"""Many input sets for ``diff``: a directory of .npz files, or one .npz with a sample axis.

Gating on one random input set says little about a user's data; a dataset diff runs every
sample through both sides and keeps statistics over all of them. Samples are read one at a
time (a directory's files lazily, a sample-axis file sliced from one load), so a thousand
samples cost the memory of one. Every sample is checked against the model like ``--inputs``.

Sample-axis files: each array carries the samples along ``axis``. An array with one more
dimension than the model input loses that axis (``[16, 1, 3, 224, 224]`` → 16 × ``[1, 3, 224, 224]``);
an array of the input's own rank keeps it with size 1 (``[16, 3, 224, 224]`` → 16 × ``[1, 3, 224, 224]``),
so a batch-1 model reads a stacked batch as samples.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from amptool.errors import UserError
from amptool.frontend.signature import TensorSpec
from amptool.runtime.inputs import check_input_arrays, read_npz

#: What a dataset's samples are called in reports, by kind of source.
SOURCE_DIRECTORY = "directory"
SOURCE_SAMPLE_AXIS = "sample-axis"


@dataclass(frozen=True)
class Samples:
    """Labelled input sets, loaded on demand: ``label(i)`` names sample ``i`` in reports."""

    source: str
    path: str
    labels: tuple[str, ...]
    _files: tuple[str, ...] = ()
    _stacked: Mapping[str, np.ndarray] | None = None
    _axis: int = 0
    _ranks: Mapping[str, int] | None = None
    _specs: tuple[TensorSpec, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for index in range(len(self)):
            yield self.load(index)

    def load(self, index: int) -> dict[str, np.ndarray]:
        """Sample ``index``, checked against the model's inputs (names and dtypes)."""
        if self._stacked is None:
            return check_input_arrays(read_npz(self._files[index], "--inputs"), self._specs, "--inputs",
                                      self._files[index])
        ranks = self._ranks or {}
        sample = {}
        for name, array in self._stacked.items():
            taken = np.take(array, [index], axis=self._axis)
            sample[name] = taken if array.ndim == ranks.get(name, array.ndim) else np.squeeze(taken, axis=self._axis)
        return check_input_arrays(sample, self._specs, "--inputs", f"{self.path} sample {index}")


def open_samples(path: str, specs: Sequence[TensorSpec], sample_axis: int | None) -> Samples | None:
    """The samples at ``path`` when it is a directory or ``sample_axis`` is given; None for a
    plain one-set .npz (the caller reads that as before)."""
    if os.path.isdir(path):
        if sample_axis is not None:
            raise UserError(f"--sample-axis splits one .npz, but --inputs {path} is a directory",
                            "Drop --sample-axis (every .npz in the directory is a sample), or pass one file.")
        return _directory(path, specs)
    if sample_axis is None:
        return None
    return _stacked(path, specs, sample_axis)


def _directory(path: str, specs: Sequence[TensorSpec]) -> Samples:
    try:
        names = sorted(n for n in os.listdir(path) if n.endswith(".npz") and not n.startswith("."))
    except OSError as err:
        raise UserError(f"--inputs {path}: cannot list the directory ({err.strerror})",
                        "Pass a readable directory of .npz files, one sample each.") from err
    files = tuple(os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n)))
    if not files:
        raise UserError(f"--inputs {path}: the directory holds no .npz files",
                        "Put one .npz per sample there (numpy.savez(path, input_name=array, ...)).")
    return Samples(SOURCE_DIRECTORY, path, tuple(os.path.basename(f) for f in files), _files=files,
                   _specs=tuple(specs))


def _stacked(path: str, specs: Sequence[TensorSpec], axis: int) -> Samples:
    arrays = read_npz(path, "--inputs")
    ranks = {s.name: len(s.shape or ()) for s in specs}
    counts = {}
    for name, array in arrays.items():
        if not -array.ndim <= axis < array.ndim:
            raise UserError(f"--sample-axis {axis}: array '{name}' in {path} has only {array.ndim} dims",
                            "Give the axis along which every array stacks its samples (usually 0).")
        counts[name] = array.shape[axis]
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"'{n}' {c}" for n, c in counts.items())
        raise UserError(f"--sample-axis {axis}: the arrays in {path} hold different numbers of samples ({listed})",
                        "Stack the same number of samples in every array.")
    count = next(iter(counts.values()), 0)
    if count < 1:
        raise UserError(f"--inputs {path}: no samples along axis {axis}", "Store at least one sample.")
    for name, array in arrays.items():
        rank = ranks.get(name)
        if rank is not None and array.ndim not in (rank, rank + 1):
            raise UserError(f"--sample-axis {axis}: array '{name}' has {array.ndim} dims; input '{name}' takes "
                            f"{rank} (the samples add one axis, or stack along a size-1 axis)",
                            "Store each array as samples × the input's shape.")
    return Samples(SOURCE_SAMPLE_AXIS, path, tuple(f"sample {i}" for i in range(count)), _stacked=arrays,
                   _axis=axis, _ranks=ranks, _specs=tuple(specs))
