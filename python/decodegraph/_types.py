"""Plain Python objects for the C++ structs: the configuration going in, plans and statistics coming out.

Field names are the C++ names (include/decodegraph/types.hpp, executor.hpp), so the C++ docs apply.
Enum fields take the enum members or their names as strings in any case ("bf16", "nhd", "auto"...).
One class per C++ struct; python/src/convert.cpp converts each in one place.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Type, TypeVar

import numpy as np
import numpy.typing as npt

from . import _core
from ._arrays import ArrayLike
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
from ._errors import InvalidArgument

E = TypeVar("E", bound=enum.Enum)

_DTYPE_ALIASES = {
    "fp16": DType.FP16, "float16": DType.FP16, "half": DType.FP16,
    "bf16": DType.BF16, "bfloat16": DType.BF16,
    "fp32": DType.FP32, "float32": DType.FP32, "float": DType.FP32,
}
# vLLM's kv_cache_dtype strings, and the numpy (ml_dtypes) / torch fp8 dtype names.
_KV_ALIASES = {
    "auto": KVCacheDType.AUTO,
    "fp8": KVCacheDType.FP8_E4M3, "fp8_e4m3": KVCacheDType.FP8_E4M3, "float8_e4m3fn": KVCacheDType.FP8_E4M3,
    "fp8_e5m2": KVCacheDType.FP8_E5M2, "float8_e5m2": KVCacheDType.FP8_E5M2,
}


def coerce_enum(cls: Type[E], value: Any, name: str) -> E:
    """``value`` as a member of ``cls``: a member, or its name (any case; dtypes also take
    fp16/float16/half, bf16/bfloat16, fp32/float32/float, numpy and torch dtypes)."""
    if isinstance(value, cls):
        return value
    key = None
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
    elif cls in (DType, KVCacheDType) and value is not None:
        # numpy dtypes and scalar types (np.float16, ml_dtypes.bfloat16), torch dtypes (torch.float16).
        text = getattr(value, "__name__", None) or str(value)
        key = text.rsplit(".", 1)[-1].lower()
    if key is not None:
        if cls is DType and key in _DTYPE_ALIASES:
            return _DTYPE_ALIASES[key]  # type: ignore[return-value]
        if cls is KVCacheDType and key in _KV_ALIASES:
            return _KV_ALIASES[key]  # type: ignore[return-value]
        for member in cls:
            if member.name.lower() == key:
                return member
    allowed = ", ".join(m.name.lower() for m in cls)
    raise InvalidArgument(f"{name} = {value!r} is invalid; allowed: {allowed} (or {cls.__name__} members)")


def numpy_dtype(dtype: DType | str) -> Any:
    """The numpy dtype of ``dtype``: float16, ml_dtypes.bfloat16 or float32."""
    d = coerce_enum(DType, dtype, "dtype")
    if d is DType.BF16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float16 if d is DType.FP16 else np.float32)


def kv_numpy_dtype(spec: "AttentionSpec") -> Any:
    """The numpy dtype of ``spec``'s KV caches: the model dtype's (:func:`numpy_dtype`) for
    ``kv_cache_dtype`` auto, ml_dtypes.float8_e4m3fn / float8_e5m2 for fp8 caches (numpy uint8
    arrays of the raw codes are accepted too)."""
    if spec.kv_cache_dtype is KVCacheDType.AUTO:
        return numpy_dtype(spec.dtype)
    import ml_dtypes

    fp8 = ml_dtypes.float8_e4m3fn if spec.kv_cache_dtype is KVCacheDType.FP8_E4M3 else ml_dtypes.float8_e5m2
    return np.dtype(fp8)


def _array_text(a: Any) -> str:
    """A short description of an array: its type, dtype, shape and (torch) device, never its values."""
    shape = getattr(a, "shape", None)
    if shape is None:
        return f"<{type(a).__name__}>"
    dtype = str(getattr(a, "dtype", "?")).replace("torch.", "")
    device = getattr(a, "device", None)
    where = f", {device}" if device is not None and str(device) not in ("cpu",) else ""
    return f"{type(a).__name__}({dtype}, {tuple(int(e) for e in shape)}{where})"


def _list_text(items: Sequence[Any], what: str) -> str:
    """A list of many similar objects, each kind once with its count: "[2 x LayerBuffers(...)]"."""
    if not items:
        return "[]"
    runs: List[Tuple[str, int]] = []
    for item in items:
        text = repr(item)
        if runs and runs[-1][0] == text:
            runs[-1] = (text, runs[-1][1] + 1)
        else:
            runs.append((text, 1))
    if len(runs) > 4:  # many distinct ones: the count and the first
        return f"[{len(items)} {what}: {runs[0][0]}, ...]"
    return "[" + ", ".join(text if n == 1 else f"{n} x {text}" for text, n in runs) + "]"


@dataclass(init=False)
class AttentionSpec:
    """The static shape of one attention layer (C++ ``AttentionSpec``).

    ``scale`` 0 selects 1/sqrt(head_size). Caches (see :meth:`k_cache_shape`):

    - ``vllm``: K ``[num_blocks, num_kv_heads, head_size / x, block_size, x]`` with
      x = 16 bytes / element size, V ``[num_blocks, num_kv_heads, head_size, block_size]``;
    - ``nhd``: K and V ``[num_blocks, block_size, num_kv_heads, head_size]``.

    ``kv_cache_dtype`` (vLLM's name, as the eager calls take it; ``kv_dtype``, the C++ field's
    name, is an alias) is the caches' element type, vLLM's ``kv_cache_dtype`` strings: ``"auto"``
    (the model ``dtype``), ``"fp8"`` / ``"fp8_e4m3"`` (OCP E4M3FN) or ``"fp8_e5m2"``; fp8 caches
    need ``dtype`` fp16 or bf16 and each layer's ``k_scale`` / ``v_scale`` (:class:`LayerBuffers`):
    K = code * k_scale, V = code * v_scale, with one scale per layer, or one per KV head when
    ``kv_scale_per_head``.

    ``sliding_window`` W (0: none) is the Hugging Face convention: the query at position
    p = L - 1 attends (p - W, p], W tokens including its own (FlashInfer / FA ``window_left`` is
    W - 1); blocks wholly before the window are never read. ``logit_softcap`` c (0: off) maps each
    logit s to c * tanh(s / c), after the scale and ALiBi, before masks. Attention sinks are a
    per-layer array (:class:`LayerBuffers`).
    """

    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_size: int = 128
    block_size: int = 16
    dtype: DType = DType.BF16
    layout: KVLayout = KVLayout.VLLM
    scale: float = 0.0
    kv_cache_dtype: KVCacheDType = KVCacheDType.AUTO
    kv_scale_per_head: bool = False
    sliding_window: int = 0
    logit_softcap: float = 0.0

    def __init__(self, num_q_heads: int = 32, num_kv_heads: int = 8, head_size: int = 128, block_size: int = 16,
                 dtype: DType | str = DType.BF16, layout: KVLayout | str = KVLayout.VLLM, scale: float = 0.0,
                 kv_cache_dtype: KVCacheDType | str | None = None, kv_scale_per_head: bool = False,
                 sliding_window: int = 0, logit_softcap: float = 0.0, *,
                 kv_dtype: KVCacheDType | str | None = None) -> None:
        kv = KVCacheDType.AUTO
        if kv_cache_dtype is not None:
            kv = coerce_enum(KVCacheDType, kv_cache_dtype, "spec.kv_cache_dtype")
        if kv_dtype is not None:  # the alias, named as given in its messages
            alias = coerce_enum(KVCacheDType, kv_dtype, "spec.kv_dtype")
            if kv_cache_dtype is not None and alias is not kv:
                raise InvalidArgument(f"kv_dtype = {kv_dtype!r} is invalid; allowed: kv_cache_dtype's value "
                                      f"{kv_cache_dtype!r}, or not given (kv_dtype is an alias of kv_cache_dtype)")
            kv = alias
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.block_size = block_size
        self.dtype = dtype  # type: ignore[assignment]  # normalised below
        self.layout = layout  # type: ignore[assignment]
        self.scale = scale
        self.kv_cache_dtype = kv
        self.kv_scale_per_head = kv_scale_per_head
        self.sliding_window = sliding_window
        self.logit_softcap = logit_softcap
        self.__post_init__()

    def __post_init__(self) -> None:
        self.dtype = coerce_enum(DType, self.dtype, "spec.dtype")
        self.layout = coerce_enum(KVLayout, self.layout, "spec.layout")
        self.kv_cache_dtype = coerce_enum(KVCacheDType, self.kv_cache_dtype, "spec.kv_cache_dtype")
        self.kv_scale_per_head = bool(self.kv_scale_per_head)

    @property
    def kv_dtype(self) -> KVCacheDType:
        """Alias of :attr:`kv_cache_dtype` (the C++ field's name)."""
        return self.kv_cache_dtype

    @kv_dtype.setter
    def kv_dtype(self, value: KVCacheDType | str) -> None:
        self.kv_cache_dtype = coerce_enum(KVCacheDType, value, "spec.kv_dtype")

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def effective_scale(self) -> float:
        """``scale``, or 1/sqrt(head_size) when it is 0."""
        return self.scale if self.scale != 0 else 1.0 / math.sqrt(self.head_size)

    @property
    def kv_elem_size(self) -> int:
        """Bytes of one cache element: 1 for fp8 caches, else the model dtype's size."""
        if self.kv_cache_dtype is not KVCacheDType.AUTO:
            return 1
        return 2 if self.dtype in (DType.FP16, DType.BF16) else 4

    @property
    def kv_scale_count(self) -> int:
        """float32 values behind each of an fp8 layer's k_scale and v_scale: num_kv_heads or 1."""
        return self.num_kv_heads if self.kv_scale_per_head else 1

    @property
    def x(self) -> int:
        """Cache elements per 16 bytes: the innermost extent of a vllm-layout K cache (16 for fp8)."""
        return 16 // self.kv_elem_size

    def k_cache_shape(self, num_blocks: int) -> Tuple[int, ...]:
        """Shape of one layer's K cache of ``num_blocks`` blocks in this layout."""
        if self.layout is KVLayout.NHD:
            return (num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        return (num_blocks, self.num_kv_heads, self.head_size // self.x, self.block_size, self.x)

    def v_cache_shape(self, num_blocks: int) -> Tuple[int, ...]:
        """Shape of one layer's V cache of ``num_blocks`` blocks in this layout."""
        if self.layout is KVLayout.NHD:
            return (num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        return (num_blocks, self.num_kv_heads, self.head_size, self.block_size)

    def validate(self) -> None:
        """Raises InvalidArgument for any unsupported value (C++ ``validate_spec``)."""
        _core.validate_spec(self)


@dataclass
class DeviceModel:
    """What the planner assumes about the GPU; zero fields are queried (CUDA) or modelled (host: an H200)."""

    num_sms: int = 0
    blocks_per_sm: int = 0

    @property
    def target_blocks(self) -> int:
        """Resident pass-1 blocks: num_sms x blocks_per_sm."""
        return self.num_sms * self.blocks_per_sm


@dataclass
class LayerBuffers:
    """One layer's arrays (C++ ``LayerBuffers``); any DLPack-capable array (numpy, torch, ...).

    - ``k_cache``, ``v_cache``: required, contiguous, in the spec's layout and dtype
      (:meth:`AttentionSpec.k_cache_shape`), at least ``num_blocks`` blocks.
    - ``q``, ``out``: ``[rows >= max_batch, num_q_heads, head_size]`` (or 2-D
      ``[rows, num_q_heads * head_size]``); ``new_key``, ``new_value``: the same with
      ``num_kv_heads``. Rows may be strided (a slice of a fused QKV buffer: a multiple of 16 bytes
      apart); heads and elements packed. ``None``: the executor owns the buffer
      (``Executor.query(l)`` & co. return it).

    - ``k_scale``, ``v_scale``: fp8 caches only (required there): float32
      ``[spec.kv_scale_count]`` on the backend's memory (numpy on the host backend). The graphs read
      them at every replay: writing new values into these arrays changes the next step's output,
      with no recapture.
    - ``sinks``: optional attention sinks (gpt-oss), float32 ``[num_q_heads]`` raw logits on the
      backend's memory, in the softmax denominator only (-inf: none for that head); read at every
      replay like the scales.

    The executor keeps every array given here alive, at a fixed address, until it is destroyed or
    ``rebind_layers`` replaces them.
    """

    k_cache: ArrayLike
    v_cache: ArrayLike
    q: Optional[ArrayLike] = None
    out: Optional[ArrayLike] = None
    new_key: Optional[ArrayLike] = None
    new_value: Optional[ArrayLike] = None
    k_scale: Optional[ArrayLike] = None
    v_scale: Optional[ArrayLike] = None
    sinks: Optional[ArrayLike] = None

    def __repr__(self) -> str:
        """Shapes and dtypes, never values (a cache's repr would print megabytes); None fields left out."""
        parts = [f"{f.name}={_array_text(getattr(self, f.name))}" for f in dataclasses.fields(self)
                 if getattr(self, f.name) is not None]
        return f"LayerBuffers({', '.join(parts)})"


@dataclass
class ExecutorConfig:
    """Executor configuration (C++ ``ExecutorConfig``); ``num_layers`` is ``len(layers)``.

    ``layer_specs`` empty: every layer uses ``spec``; else one :class:`AttentionSpec` per layer,
    which may differ from ``spec`` in heads, head size and scale (block size, dtype and layout are
    ``spec``'s); layers with equal specs form a layer group with its own plans
    (:meth:`Executor.layer_group`). Each layer's arrays have its own spec's shapes.
    ``num_blocks`` 0 takes the first layer's K cache's ``shape[0]``; empty ``band_edges`` /
    ``batch_buckets`` take the defaults (:func:`decodegraph.default_band_edges`,
    :func:`decodegraph.default_batch_buckets`); ``validation`` None takes the library's default
    (``CHEAP`` in release builds). See include/decodegraph/executor.hpp for every field.

    ``q_lens`` lists the query tokens per sequence the executor captures graphs for (speculative
    decoding: 1 + k for k drafted tokens, e.g. ``[1, 4]``); each 1..16, distinct, not empty.
    Every step names its ``q_len``, one of them; layer buffers hold ``max_batch * max(q_lens)`` rows.
    """

    spec: AttentionSpec = field(default_factory=AttentionSpec)
    layers: List[LayerBuffers] = field(default_factory=list)
    layer_specs: List[AttentionSpec] = field(default_factory=list)
    max_batch: int = 8
    max_seq_len: int = 8192
    num_blocks: int = 0
    max_blocks_per_seq: int = 0
    v2_threshold: int = 8192
    band_edges: List[int] = field(default_factory=list)
    batch_buckets: List[int] = field(default_factory=list)
    partition_size: int = 0
    policy: KernelPolicy = KernelPolicy.AUTO
    device_model: Optional[DeviceModel] = None
    measure_replays: int = 3
    band_select: BandSelect = BandSelect.DEVICE
    capture: CapturePolicy = CapturePolicy.LAZY
    backend: BackendKind = BackendKind.AUTO
    validation: Optional[ValidationLevel] = None
    append_kv: bool = True
    programmatic_launch: bool = True
    memory_budget_bytes: int = 0
    log_level: str = ""
    alibi_slopes: Optional[Sequence[float]] = None
    q_lens: List[int] = field(default_factory=lambda: [1])

    def __post_init__(self) -> None:
        self.normalize()

    def normalize(self) -> None:
        """Converts enum names to members and checks the field types (run again by Executor)."""
        if not isinstance(self.spec, AttentionSpec):
            raise InvalidArgument(f"spec = {self.spec!r} is invalid; allowed: an AttentionSpec")
        self.spec.__post_init__()
        self.layer_specs = list(self.layer_specs)
        for i, s in enumerate(self.layer_specs):
            if not isinstance(s, AttentionSpec):
                raise InvalidArgument(f"layer_specs[{i}] = {s!r} is invalid; allowed: an AttentionSpec")
            s.__post_init__()
        self.policy = coerce_enum(KernelPolicy, self.policy, "policy")
        self.band_select = coerce_enum(BandSelect, self.band_select, "band_select")
        self.capture = coerce_enum(CapturePolicy, self.capture, "capture")
        self.backend = coerce_enum(BackendKind, self.backend, "backend")
        if self.validation is not None:
            self.validation = coerce_enum(ValidationLevel, self.validation, "validation")
        if self.device_model is not None and not isinstance(self.device_model, DeviceModel):
            raise InvalidArgument(f"device_model = {self.device_model!r} is invalid; allowed: a DeviceModel or None")
        self.layers = list(self.layers)
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LayerBuffers):
                raise InvalidArgument(f"layers[{i}] = {type(layer).__name__} is invalid; allowed: a LayerBuffers")
        self.band_edges = [int(e) for e in self.band_edges]
        self.batch_buckets = [int(b) for b in self.batch_buckets]
        # The values are the library's to check (range, duplicates, empty); here only the type.
        if isinstance(self.q_lens, (str, bytes)) or not isinstance(self.q_lens, Iterable):
            raise InvalidArgument(f"q_lens = {self.q_lens!r} is invalid; allowed: a list of ints, e.g. [1] or [1, 4]")
        q_lens = list(self.q_lens)
        for i, q in enumerate(q_lens):
            if isinstance(q, bool) or not isinstance(q, numbers.Integral):
                raise InvalidArgument(f"q_lens[{i}] = {q!r} is invalid; allowed: an int 1..16")
        self.q_lens = [int(q) for q in q_lens]
        if self.alibi_slopes is not None:
            self.alibi_slopes = [float(s) for s in self.alibi_slopes]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_spec(self, layer: int) -> AttentionSpec:
        """Layer ``layer``'s spec: ``layer_specs[layer]``, or ``spec`` when layer_specs is empty."""
        return self.layer_specs[layer] if self.layer_specs else self.spec

    def __repr__(self) -> str:
        """One line: every field, the layers and layer specs as counts of each kind (shapes and
        dtypes, never array values), ALiBi slopes as a count."""
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "layers":
                text = _list_text(v, "LayerBuffers")
            elif f.name == "layer_specs":
                text = _list_text(v, "AttentionSpec")
            elif f.name == "alibi_slopes" and v is not None:
                text = f"<{len(v)} floats>"
            else:
                text = repr(v)
            parts.append(f"{f.name}={text}")
        return f"ExecutorConfig({', '.join(parts)})"


@dataclass
class PlanCandidate:
    """One launch KernelPolicy.MEASURED times for a bucket; ``us`` -1: not measured."""

    kernel: KernelKind
    partition_size: int
    us: float
    predicted_us: float  # the cost model's microseconds for what ``us`` measures


@dataclass
class PlanPrediction:
    """The cost model's microseconds per attention call, and share of the read roof, when every
    sequence has ``len`` tokens (C++ ``PlanPrediction``), with ``us`` broken down: ``loop_us`` +
    ``fixed_us`` + ``merge_us`` + ``launch_us`` (``issue_us``: the part of ``loop_us`` the SM's
    instruction issue adds). Predictions, not measurements."""

    len: int
    us: float
    roof_share: float
    loop_us: float = 0.0
    fixed_us: float = 0.0
    merge_us: float = 0.0
    launch_us: float = 0.0
    issue_us: float = 0.0


@dataclass
class BucketPlan:
    """The plan of one bucket (batch bucket x length band) for one layer group (``group``; 0 when
    every layer has one spec), C++ ``BucketPlan``.

    ``grid`` is the attention (V1 or V2 pass 1) grid (x, y, z), ``merge_grid`` V2's pass-2 grid
    (heads, sequences, 32-element slices); ``predicted_lo/mid/hi`` the cost model at the band's edges;
    ``reason_text`` is ``describe_reason``'s line. Lengths in (band_lo, band_hi] replay it.
    ``q_len`` is the query tokens per sequence of the steps it runs (one of ``ExecutorConfig.q_lens``).
    """

    batch: int
    band: int
    band_lo: int
    band_hi: int
    kernel: KernelKind
    partition_size: int
    max_partitions: int
    grid: Tuple[int, int, int]
    merge_grid: Tuple[int, int, int]
    workspace_bytes: int
    launch_len: int
    design_len: int
    window: int
    blocks: int
    target_blocks: int
    live_blocks_at_band_lo: int
    waves: float
    predicted_lo: PlanPrediction
    predicted_mid: PlanPrediction
    predicted_hi: PlanPrediction
    predicted_regret: float
    candidates_scored: int
    reason: PlanReason
    reason_text: str
    graph_id: int
    candidates: List[PlanCandidate]
    group: int = 0
    q_len: int = 1

    @classmethod
    def _from_core(cls, d: Dict[str, Any]) -> BucketPlan:
        d = dict(d)
        d["candidates"] = [PlanCandidate(**c) for c in d["candidates"]]
        for k in ("predicted_lo", "predicted_mid", "predicted_hi"):
            d[k] = PlanPrediction(**d[k])
        return cls(**d)


@dataclass
class StepResult:
    """What one step ran (C++ ``StepResult``). ``bucket`` is the batch bucket's index; ``band`` is -1
    (and band_hi, kernel, partition_size unknown, launch_id -1) when a kDevice graph chose the band on
    the device. ``graph_id`` names the graph replayed (``stats().graphs[].graph_id``: kHost one per
    launch, kDevice one per (q_len, batch bucket)); ``launch_id`` the launch it ran (``BucketPlan.graph_id``);
    ``q_len`` the step's query tokens per sequence.

    Slotted (no instance dict, no field defaults): step() makes one per call, and the binding fills
    its slots directly (python/src/convert.cpp), which costs a fraction of what ``__init__`` does."""

    __slots__ = ("bucket", "bucket_batch_size", "band", "band_hi", "kernel", "partition_size", "band_on_device",
                 "captured", "measured", "graph_id", "launch_id", "q_len")
    bucket: int
    bucket_batch_size: int
    band: int
    band_hi: int
    kernel: KernelKind
    partition_size: int
    band_on_device: bool
    captured: bool
    measured: bool
    graph_id: int
    launch_id: int
    q_len: int


@dataclass
class GraphStats:
    """One captured graph (C++ ``GraphStats``); a graph shared by several buckets appears once."""

    graph_id: int
    batch: int
    band: int
    last_band: int
    band_lo: int
    band_hi: int
    buckets: int
    kernel: KernelKind
    partition_size: int
    captures: int
    updates: int
    reinstantiations: int
    replays: int
    nodes: int
    capture_ms: float
    instantiate_ms: float
    measure_ms: float
    bytes: int
    switch_graph: bool
    branches: int
    band_replays: List[int]
    band_kernels: List[KernelKind]
    band_launch_ids: List[int]
    group_kernels: List[KernelKind] = field(default_factory=list)  # [group]: kHost its kernel, kDevice its longest band's
    group_band_kernels: List[List[KernelKind]] = field(default_factory=list)  # kDevice: [group][band - this.band]
    q_len: int = 1  # query tokens per sequence of every step it replays


@dataclass
class ExecutorStats:
    """Capture and replay counters (C++ ``ExecutorStats``)."""

    graphs: List[GraphStats]
    band_select: BandSelect
    band_select_note: str
    programmatic_launch: bool
    programmatic_launch_note: str
    buckets: int
    distinct_graphs: int
    distinct_plans: int
    undecided_buckets: int
    steps: int
    rejected_steps: int
    total_captures: int
    capture_ms: float
    instantiate_ms: float
    measure_ms: float
    measured_buckets: int
    candidate_graphs: int
    rebinds: int
    graph_updates: int
    graph_reinstantiations: int
    input_downloads: int
    staging_copy_bytes: int
    bad_block_reports: int
    replays_v1: int  # V1 launches replayed, summed over every layer group (one per group per replay)
    replays_v2: int  # the same for V2
    group_replays: List[Tuple[int, int]] = field(default_factory=list)  # [group] -> (V1, V2) replays

    def replays(self, kind: KernelKind | str, group: Optional[int] = None) -> int:
        """Replays of ``kind``'s launches: in layer group ``group`` (C++ ``ExecutorStats::replays``),
        or with ``group`` None summed over every group (``replays_v1`` / ``replays_v2``): a step
        whose group 0 runs V1 and group 1 V2 counts one of each. One layer group: the same."""
        v1 = coerce_enum(KernelKind, kind, "kind") is KernelKind.V1
        if group is None:
            return self.replays_v1 if v1 else self.replays_v2
        if not 0 <= group < len(self.group_replays):
            raise InvalidArgument(f"group = {group} is invalid; allowed: a layer group 0..{len(self.group_replays) - 1}")
        return self.group_replays[group][0 if v1 else 1]

    @classmethod
    def _from_core(cls, d: Dict[str, Any]) -> ExecutorStats:
        d = dict(d)
        d["graphs"] = [GraphStats(**g) for g in d["graphs"]]
        return cls(**d)


@dataclass
class MemoryReport:
    """Memory the executor holds, in bytes (C++ ``MemoryReport``)."""

    static_buffers: int
    workspace: int
    graphs: int

    @property
    def total(self) -> int:
        return self.static_buffers + self.workspace + self.graphs


@dataclass
class HostStaging:
    """The executor's host staging buffers as zero-copy numpy views: write a step's inputs here and
    pass (slices of) them to ``step()``, which then skips its copy. ``block_tables`` is
    ``[max_batch, block_table_stride]``; pass ``block_tables[:n]``. ``slot_mapping`` holds
    ``max_batch * max(q_lens)`` entries: pass ``slot_mapping[:n]`` (q_len 1) or
    ``slot_mapping[:n * q_len].reshape(n, q_len)``.

    ``Executor.host_staging()`` returns one of at most three such objects (one per set of pinned
    buffers the executor has), made once and reused: the views stay valid, at the same addresses,
    for as long as the executor's memory lives (they hold it), so keep them. Which set is yours to
    write is the one the last ``host_staging()`` call returned (the host backend: always the same)."""

    seq_lens: npt.NDArray[np.int32]
    block_tables: npt.NDArray[np.int32]
    slot_mapping: npt.NDArray[np.int64]
    block_table_stride: int


def replace_config(config: ExecutorConfig, **changes: Any) -> ExecutorConfig:
    """A copy of ``config`` with ``changes`` (dataclasses.replace, normalised)."""
    return dataclasses.replace(config, **changes)
