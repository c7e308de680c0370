"""The array types of decodegraph's signatures.

The binding takes any array it can address (python/src/tensor.cpp): numpy arrays (ml_dtypes
bfloat16 / float8 included), and anything with ``__dlpack__`` (torch, cupy, jax) or
``__cuda_array_interface__``. It gives back views of the executor's buffers: numpy arrays on the
host backend, torch tensors (or DLPack-capable objects) on CUDA. These protocols say so to a type
checker: numpy arrays and torch tensors satisfy all of them.
"""

from __future__ import annotations

from typing import Any, Dict, Protocol, Tuple, TypeVar, Union

import numpy.typing as npt


class DLPackArray(Protocol):
    """An object that exports itself through DLPack: torch tensors, cupy and jax arrays, numpy."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __dlpack_device__(self) -> Tuple[int, int]: ...


class CudaArrayInterface(Protocol):
    """An object with ``__cuda_array_interface__`` (numba, cupy, older CUDA array producers)."""

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]: ...


ArrayLike = Union[npt.NDArray[Any], DLPackArray, CudaArrayInterface]
"""An array argument: a numpy array, or a DLPack / CUDA-array-interface producer (torch, cupy)."""

A = TypeVar("A", bound=ArrayLike)
"""An array argument that a call returns as it was given (the eager calls' ``out``)."""


class ArrayView(Protocol):
    """A zero-copy view of executor memory: a numpy array on the host backend, a torch tensor (or a
    DLPack-capable object) on CUDA. Index it, assign into it, or hand it to ``np.asarray`` /
    ``torch.from_dlpack``."""

    @property
    def shape(self) -> Tuple[int, ...]: ...

    def __getitem__(self, key: Any) -> Any: ...

    def __setitem__(self, key: Any, value: Any) -> None: ...

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __dlpack_device__(self) -> Tuple[int, int]: ...


class TorchStreamLike(Protocol):
    """A stream with an int ``cuda_stream`` handle (``torch.cuda.Stream``)."""

    @property
    def cuda_stream(self) -> int: ...


class CudaStreamProtocol(Protocol):
    """A stream implementing CUDA Python's ``__cuda_stream__`` protocol: (version, handle)."""

    def __cuda_stream__(self) -> Tuple[int, int]: ...


StreamLike = Union[int, TorchStreamLike, CudaStreamProtocol, None]
"""A ``stream=`` argument: an int ``cudaStream_t``, a torch stream, a ``__cuda_stream__`` object, or
None (eager calls: the legacy default stream; ``Executor.step``: the executor's own stream)."""
