"""The fault-injection seam (C++ decodegraph::fault, include/decodegraph/fault.hpp), for tests.

An armed site makes the library's next call there fail as a real failure of that call most often
does: :class:`~decodegraph.OutOfMemory` at ``ALLOC``, a :class:`~decodegraph.CudaError` with code
999 and ``context_lost`` False everywhere else. Process-wide: do not use it beside real work.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from . import _core
from ._core import FaultSite as Site


def arm(site: Site, skip: int = 0, count: int = 1) -> None:
    """Lets ``skip`` calls at ``site`` pass, then fails the next ``count``."""
    _core.fault_arm(site, skip, count)


def disarm(site: Site) -> None:
    _core.fault_disarm(site)


def disarm_all() -> None:
    _core.fault_disarm_all()


def fired(site: Site) -> int:
    """Injected failures at ``site`` since it was last disarmed."""
    return int(_core.fault_fired(site))


@contextlib.contextmanager
def inject(site: Site, skip: int = 0, count: int = 1) -> Iterator[None]:
    """Arms ``site`` for the ``with`` block and disarms every site after it."""
    arm(site, skip, count)
    try:
        yield
    finally:
        disarm_all()


__all__ = ["Site", "arm", "disarm", "disarm_all", "fired", "inject"]
