"""TVM's schedule primitives without their per-call argument type checks, during amptool's builds.

Every method of ``tvm.s_tir.Schedule`` is wrapped by ``type_checked``, which binds the call's
signature and walks each argument against its type hint in Python before the FFI call. A
ResNet-50's CPU build makes ~3,600 such calls: the checks took 0.43 s of its 1.9 s compile stage
(median of 5 converts each way, 2 cores). They only raise ``TypeError`` on a wrong argument type,
which amptool's rules do not pass (a rule that did would still fail, in the FFI, and be skipped as
any failing rule is). Outside ``unchecked_schedules`` TVM's checks are as TVM ships them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from amptool._tvm.swap import SwappedAttributes


def _schedule_class() -> Any:
    from tvm import s_tir  # noqa: PLC0415

    return s_tir.Schedule


def _unwrapped(schedule_class: Any) -> dict[str, Any]:
    """Each type-checked method's function as written (``functools.wraps`` keeps it as ``__wrapped__``)."""
    return {name: method.__wrapped__ for name, method in vars(schedule_class).items()
            if callable(method) and hasattr(method, "__wrapped__")}


_UNCHECKED = SwappedAttributes(_schedule_class, _unwrapped)


def unchecked_schedules() -> contextlib.AbstractContextManager[None]:
    """Within the block (nestable, thread-safe), ``Schedule`` methods skip the argument checks."""
    return _UNCHECKED.block()
