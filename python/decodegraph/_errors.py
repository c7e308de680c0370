"""decodegraph's exceptions: the C++ decodegraph::Error and its kinds, as Python classes.

Everything the library raises is an :class:`Error`; its kinds tell the caller what to do:

- :class:`InvalidArgument` (also a ``ValueError``): bad input or configuration, naming the
  parameter, the value and what is allowed. Nothing ran; the executor stays usable.
- :class:`OutOfMemory` (also a ``MemoryError``): a device or host allocation failed. Nothing
  half-built is kept.
- :class:`CudaError`: another CUDA call failed. ``code`` is the ``cudaError_t``; when
  ``context_lost`` is true every later CUDA call in the process fails, so restart it; otherwise the
  executor stays usable.

A plain :class:`Error` is a broken internal invariant, or CUDA work asked of a build without CUDA.
"""

from __future__ import annotations


class Error(RuntimeError):
    """Base of every error decodegraph raises (C++ ``decodegraph::Error``)."""


class InvalidArgument(Error, ValueError):
    """Bad input or configuration; the message names the parameter, the value and what is allowed."""


class OutOfMemory(Error, MemoryError):
    """A device or host allocation failed; nothing half-built is kept."""


class CudaError(Error):
    """A CUDA call failed.

    Attributes:
        code: the ``cudaError_t`` value (999, ``cudaErrorUnknown``, for an injected fault).
        context_lost: the error is sticky: every later CUDA call in this process fails too.
    """

    code: int
    context_lost: bool

    def __init__(self, message: str, code: int = 0, context_lost: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.context_lost = context_lost

    def __reduce__(self) -> tuple[type[CudaError], tuple[str, int, bool]]:
        return (type(self), (str(self), self.code, self.context_lost))


for _cls in (Error, InvalidArgument, OutOfMemory, CudaError):
    _cls.__module__ = "decodegraph"  # shown as decodegraph.InvalidArgument in tracebacks
del _cls
