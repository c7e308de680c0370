"""decodegraph's exceptions: the C++ decodegraph::Error and its kinds, as Python classes.

Everything the library raises is an :class:`Error`; its kinds tell the caller what to do:

- :class:`InvalidArgument` (also a ``ValueError``): bad input or configuration, naming the
  parameter, the value and what is allowed. Nothing ran; the executor stays usable.
- :class:`CorruptedStepReport` (an :class:`InvalidArgument`; catch it first): an *earlier* step,
  under ``validation="cheap"``, read a bad block id or was given a wrong slot; the kernels clamped
  or skipped it, so one sequence's output or new K/V is wrong. Raised by the next ``step()`` (which
  then ran nothing: submit it again) or ``check_errors()``. Re-prefill the sequence it names.
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


class CorruptedStepReport(InvalidArgument):
    """The delayed report of a bad block id or a wrong slot (C++ ``decodegraph::CorruptedStepReport``).

    Attributes:
        kind: ``"bad_block_id"``, ``"slot_mismatch"`` (not the slot of position seq_len - 1) or
            ``"slot_past_cache"``.
        first_step, last_step: the steps (counted as ``stats().steps`` counts them) one of which made
            the mistake; equal when errors are checked after every step.
        step_refused: ``step()`` raised it and ran nothing (submit its inputs again); False from
            ``check_errors()``.
        sequence: the row of that step's inputs, or -1 when not recorded.
        block_table_column: the table column of a bad block id, else -1.
    """

    kind: str
    first_step: int
    last_step: int
    step_refused: bool
    sequence: int
    block_table_column: int

    def __init__(self, message: str, kind: str = "bad_block_id", first_step: int = 0, last_step: int = 0,
                 step_refused: bool = False, sequence: int = -1, block_table_column: int = -1) -> None:
        super().__init__(message)
        self.kind = kind
        self.first_step = first_step
        self.last_step = last_step
        self.step_refused = step_refused
        self.sequence = sequence
        self.block_table_column = block_table_column

    def __reduce__(self) -> tuple[type[CorruptedStepReport], tuple[str, str, int, int, bool, int, int]]:
        return (type(self), (str(self), self.kind, self.first_step, self.last_step, self.step_refused,
                             self.sequence, self.block_table_column))


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


for _cls in (Error, InvalidArgument, CorruptedStepReport, OutOfMemory, CudaError):
    _cls.__module__ = "decodegraph"  # shown as decodegraph.InvalidArgument in tracebacks
del _cls
