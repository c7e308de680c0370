"""decodegraph: paged decode attention replayed as CUDA graphs, from Python.

The same concepts as the C++ API (include/decodegraph/), in Python idiom; docs/python.md is the
reference. Arrays go in and out as DLPack-capable objects: numpy on the host backend, torch (or any
``__dlpack__`` / ``__cuda_array_interface__`` producer) on a GPU.

- Eager calls: :func:`paged_attention_v1`, :func:`paged_attention_v2` (+ :func:`v2_workspace_size`),
  :func:`append_kv`.
- :class:`Executor`: plans every (batch bucket, length band), captures graphs, replays one per step.
- Errors: :class:`Error` and its kinds :class:`InvalidArgument` (a ValueError; its subclass
  :class:`CorruptedStepReport` is the delayed report of a bad block id or slot),
  :class:`OutOfMemory` (a MemoryError), :class:`CudaError` (``code``, ``context_lost``).
"""

from __future__ import annotations

from typing import Any, Dict, List

from ._errors import CorruptedStepReport, CudaError, Error, InvalidArgument, OutOfMemory  # before _core: it raises them
from . import _core
from ._core import (
    BackendKind,
    BandSelect,
    CapturePolicy,
    DType,
    KernelKind,
    KernelPolicy,
    KVCacheDType,
    KVLayout,
    PlanReason,
    ValidationLevel,
)
from ._arrays import ArrayLike, ArrayView, DLPackArray, StreamLike
from ._eager import append_kv, paged_attention_v1, paged_attention_v2, v2_workspace_size
from ._executor import Executor, StepBody, StepContext
from ._types import (
    AttentionSpec,
    BucketPlan,
    DeviceModel,
    ExecutorConfig,
    ExecutorStats,
    GraphStats,
    HostStaging,
    LayerBuffers,
    MemoryReport,
    PlanCandidate,
    PlanPrediction,
    StepResult,
    kv_numpy_dtype,
    numpy_dtype,
)
from . import fault

__version__: str = _core.version()

SUPPORTED_HEAD_SIZES: List[int] = list(_core.SUPPORTED_HEAD_SIZES)
SUPPORTED_BLOCK_SIZES: List[int] = list(_core.SUPPORTED_BLOCK_SIZES)


def built_with_cuda() -> bool:
    """True when this build has the CUDA kernels and backend (nvcc was found at build time)."""
    return bool(_core.built_with_cuda())


def cuda_device_available() -> bool:
    """True when this build has CUDA and a usable device is present."""
    return bool(_core.cuda_device_available())


def build_info() -> Dict[str, Any]:
    """What this build is: version, CUDA or host only, the CUDA architectures, whether a device is present."""
    return {
        "version": __version__,
        "cuda": built_with_cuda(),
        "cuda_compiler_version": _core.CUDA_COMPILER_VERSION or None,
        "cuda_architectures": _core.CUDA_ARCHITECTURES or None,
        "cuda_device_available": cuda_device_available(),
    }


def default_band_edges(max_seq_len: int, v2_threshold: int = 8192) -> List[int]:
    """The default length bands: powers of two from 512 up to max_seq_len, plus the threshold."""
    return list(_core.default_band_edges(max_seq_len, v2_threshold))


def default_batch_buckets(max_batch: int) -> List[int]:
    """The default batch buckets: 1, 2, 4, 8, then steps of 8 up to 256 and of 16 beyond, up to max_batch."""
    return list(_core.default_batch_buckets(max_batch))


def host_device_model(spec: AttentionSpec) -> DeviceModel:
    """The host backend's device model for ``spec``: an H200 with the pass-1 kernel's occupancy."""
    return DeviceModel(**_core.host_device_model(spec))


def balanced_partition_size(design_len: int, min_parts: int, block_size: int) -> int:
    """V2 partition size: the longest P splitting design_len into at least min_parts balanced partitions."""
    return int(_core.balanced_partition_size(design_len, min_parts, block_size))


def plan_buckets(config: ExecutorConfig) -> List[BucketPlan]:
    """The plans an Executor with ``config`` makes, without building one (no layers needed)."""
    config.normalize()
    return [BucketPlan._from_core(d) for d in _core.plan_buckets(config)]


__all__ = [
    "ArrayLike", "ArrayView", "DLPackArray", "StreamLike", "AttentionSpec", "BackendKind", "BandSelect", "BucketPlan", "CapturePolicy", "CudaError",
    "DType", "DeviceModel", "Error", "Executor", "ExecutorConfig", "ExecutorStats", "GraphStats",
    "HostStaging", "InvalidArgument", "CorruptedStepReport", "KVCacheDType", "KVLayout", "KernelKind", "KernelPolicy",
    "LayerBuffers",
    "MemoryReport", "OutOfMemory", "PlanCandidate", "PlanPrediction", "PlanReason", "StepBody", "StepContext",
    "StepResult", "SUPPORTED_BLOCK_SIZES", "SUPPORTED_HEAD_SIZES", "ValidationLevel",
    "__version__", "append_kv", "balanced_partition_size", "build_info", "built_with_cuda",
    "cuda_device_available", "default_band_edges", "default_batch_buckets", "fault",
    "host_device_model", "kv_numpy_dtype", "numpy_dtype", "paged_attention_v1", "paged_attention_v2", "plan_buckets",
    "v2_workspace_size",
]
