"""The decode-step executor (C++ ``decodegraph::Executor``) in Python.

Keep-alive rules:

- The executor holds every array it was given (``LayerBuffers``: caches, q/out/new K/V) until it
  is destroyed or :meth:`Executor.rebind_layers` replaces them; their addresses are fixed into the
  graphs, so they must not be resized or reallocated in place meanwhile.
- The views it returns (:meth:`Executor.query` & co., :meth:`Executor.host_staging`) hold the
  executor's memory (its buffers and the arrays it was given), not the Python object: the memory
  lives as long as any view of it, and the executor itself is freed as usual.
- The step body, and the host callbacks it enqueues, are held by the executor. A body or callback
  that refers back to the executor object forms a cycle that Python's collector frees; a callback
  that holds a *view* forms one it cannot see through (numpy arrays do not take part in cycle
  collection), so read views inside the callback (``ex.query(l)``) rather than capturing them, or
  give the executor your own q/out arrays.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Union, cast

from . import _core
from ._arrays import ArrayLike, ArrayView, StreamLike
from ._core import BackendKind, BandSelect, DType
from ._errors import InvalidArgument
from ._types import (
    AttentionSpec,
    BucketPlan,
    ExecutorConfig,
    ExecutorStats,
    HostStaging,
    LayerBuffers,
    MemoryReport,
    StepResult,
    replace_config,
)


class StepContext:
    """Given to the step body while a graph is captured; what it enqueues becomes the graph.

    Valid only inside the body. Host backend: :meth:`enqueue_host` records Python work that runs at
    every replay, in order with the layers' :meth:`append_kv` and :meth:`attention`. CUDA backend:
    launch your own kernels on :attr:`stream` (the stream being captured).
    """

    __slots__ = ("_ctx",)

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    @property
    def stream(self) -> int:
        """The stream being captured (CUDA backend; 0 on the host backend), as an int handle."""
        return int(self._ctx.stream)

    @property
    def backend(self) -> BackendKind:
        backend: BackendKind = self._ctx.backend
        return backend

    @property
    def plan(self) -> BucketPlan:
        """The plan of the graph being captured: its batch and launch_len bound every step it replays."""
        return BucketPlan._from_core(self._ctx.plan)

    def append_kv(self, layer: int) -> None:
        """Appends layer ``layer``'s new K/V (the step's slot_mapping) into its cache."""
        self._ctx.append_kv(layer)

    def attention(self, layer: int) -> None:
        """Attention for layer ``layer`` on its q/out buffers."""
        self._ctx.attention(layer)

    def enqueue_host(self, fn: Callable[[], None]) -> None:
        """Records ``fn()`` into the graph (host backend only): it runs, with the GIL, at every replay.
        An exception it raises propagates out of ``step()``."""
        self._ctx.enqueue_host(fn)


StepBody = Callable[[StepContext], None]


class Executor:
    """Captures the attention of a decode step into graphs and replays the right one each step.

    ``Executor(config)`` with an :class:`ExecutorConfig`, or ``Executor(**fields)`` with its fields
    as keywords (or both: the keywords replace the config's fields). Planning happens here; graphs
    are captured lazily (or up front with ``capture="up_front"``). ``backend="auto"`` picks CUDA when
    this build has it and a device is present, else the host backend.

    Each step: write q (and new K/V) into :meth:`query` / :meth:`new_key` / :meth:`new_value` (or
    your own arrays given in ``LayerBuffers``), call :meth:`step`, read :meth:`output`.
    Calls from several threads are serialised; long calls release the GIL.
    """

    def __init__(
        self,
        config: Optional[ExecutorConfig] = None,
        /,
        *,
        step_body: Optional[StepBody] = None,
        **fields: Any,
    ) -> None:
        if config is None:
            config = ExecutorConfig(**fields)
        elif fields:
            config = replace_config(config, **fields)
        else:
            config = replace_config(config)
        config.normalize()
        self._config = config
        self._layers: List[LayerBuffers] = list(config.layers)
        body = None
        if step_body is not None:
            user_body = step_body

            def body(ctx: Any) -> None:
                user_body(StepContext(ctx))

        self._core = _core.Executor(config, body)

    # ------------------------------------------------------------------ steps

    def step(
        self,
        seq_lens: ArrayLike,
        block_tables: ArrayLike,
        slot_mapping: Optional[ArrayLike] = None,
        *,
        stream: StreamLike = None,
        max_seq_len: Optional[int] = None,
        q_len: int = 1,
    ) -> StepResult:
        """Validates, buckets, stages and replays one decode step.

        Args:
            seq_lens: int32 [num_seqs], each sequence's tokens including the ``q_len`` appended this
                step (so each at least ``q_len``), or 0 for a padded row (vLLM's padding of a graph
                batch: its output rows are left untouched and it appends nothing; its slots must
                be negative).
            block_tables: int32 [num_seqs, block_table_stride], contiguous.
            slot_mapping: int64 [num_seqs, q_len]: entry (i, j) is the slot of position
                seq_len - q_len + j (negative: skip that token's append); [num_seqs] also when
                ``q_len`` is 1. Required unless ``append_kv=False``.
            stream: CUDA backend: an int cudaStream_t or a torch.cuda.Stream to stage and replay on,
                in order with your work there; None runs on the executor's own :attr:`stream`.
                Ignored by the host backend.
            max_seq_len: optional bound on this step's lengths; with device-resident inputs it
                spares step() reading them back.
            q_len: query tokens per sequence (speculative decoding: 1 + drafts), one of
                :attr:`q_lens`. Rows [num_seqs, q_len] of q, out and new K/V are used
                (``query(l, q_len)`` & co.); row j of a sequence of L tokens sits at position
                L - q_len + j and attends positions <= L - q_len + j.

        Inputs on the host (numpy) or, on the CUDA backend, on the device (torch CUDA tensors).
        The host backend runs the step before returning; CUDA enqueues it on the stream.

        Raises:
            CorruptedStepReport: an earlier step (``validation="cheap"``) read a bad block id or was
                given a wrong slot; this call ran nothing: submit it again, re-prefill the sequence.
            InvalidArgument: bad input; nothing ran and the executor is unchanged.
        """
        # Positional (cheaper than keywords): the binding returns the StepResult itself.
        return self._core.step(seq_lens, block_tables, slot_mapping, stream, max_seq_len or 0, q_len)

    def capture_all(self) -> None:
        """Captures every bucket now (what ``capture="up_front"`` does in the constructor)."""
        self._core.capture_all()

    def check_errors(self) -> None:
        """Waits for the last step and raises CorruptedStepReport if a step since the last report read a
        block id outside [0, num_blocks) or was given a slot past the cache or not that of position
        seq_len - 1 (possible under ``validation="cheap"``); it names the sequence to re-prefill."""
        self._core.check_errors()

    def rebind_layers(self, layers: Sequence[LayerBuffers]) -> None:
        """Points every graph at new arrays of the same shapes (a reallocated cache, say). The old
        arrays are released once it returns; on error nothing changes."""
        layers = list(layers)
        for i, layer in enumerate(layers):
            if not isinstance(layer, LayerBuffers):
                raise TypeError(f"layers[{i}]: expected LayerBuffers, got {type(layer).__name__}")
        self._core.rebind_layers(layers)
        self._layers = layers
        self._config = replace_config(self._config, layers=layers)

    # ------------------------------------------------------------------ buffers (zero-copy views)

    def _view(self, layer: int, which: int, given: Any, q_len: Optional[int]) -> ArrayView:
        core = (self._core.query, self._core.output, self._core.new_key, self._core.new_value)[which]
        v = core(layer, q_len)  # checks layer and q_len, also for a caller buffer
        if given is None:
            return _as_array(v, self._config.spec.dtype, self.backend)
        if q_len is None:
            return cast(ArrayView, given)  # numpy and torch arrays are ArrayViews
        # A caller buffer [rows, heads, head_size] or [rows, heads * head_size]: its first
        # max_batch * q_len rows as [max_batch, q_len, heads, head_size] (a view where the array
        # type reshapes without copying: numpy, torch).
        s = self.layer_spec(layer)
        heads = s.num_q_heads if which < 2 else s.num_kv_heads
        mb = self._config.max_batch
        return cast(ArrayView, given[: mb * q_len].reshape(mb, q_len, heads, s.head_size))

    def _given(self, layer: int, name: str) -> Any:
        if 0 <= layer < len(self._layers):
            return getattr(self._layers[layer], name)
        return None

    def query(self, layer: int, q_len: Optional[int] = None) -> ArrayView:
        """Layer ``layer``'s q, written by you before a step: [max_batch * max(q_lens), num_q_heads,
        head_size] of its spec (every row; [max_batch, ...] with the default ``q_lens``), or with
        ``q_len`` n (one of :attr:`q_lens`) the rows a step of n uses as [max_batch, n,
        num_q_heads, head_size] (row (s, j) is token j of sequence s).
        A zero-copy view of the executor's buffer (numpy on the host backend; a torch tensor on
        CUDA when torch is importable, else a DLPack-capable object), or your own array if you gave
        one in LayerBuffers (with ``q_len``, its first rows reshaped)."""
        return self._view(layer, 0, self._given(layer, "q"), q_len)

    def output(self, layer: int, q_len: Optional[int] = None) -> ArrayView:
        """Layer ``layer``'s attention output, shaped as :meth:`query`; rows past the step's
        num_seqs (x q_len) are padding. A view, as :meth:`query`."""
        return self._view(layer, 1, self._given(layer, "out"), q_len)

    def new_key(self, layer: int, q_len: Optional[int] = None) -> ArrayView:
        """Layer ``layer``'s new K, appended at slot_mapping each step: as :meth:`query` with
        num_kv_heads."""
        return self._view(layer, 2, self._given(layer, "new_key"), q_len)

    def new_value(self, layer: int, q_len: Optional[int] = None) -> ArrayView:
        """Layer ``layer``'s new V: as :meth:`new_key`."""
        return self._view(layer, 3, self._given(layer, "new_value"), q_len)

    def host_staging(self) -> HostStaging:
        """The pinned host staging buffers to write the next step's inputs into, as numpy views:
        inputs written there and passed to step() as they are skip step()'s copy. The executor has
        at most three sets (the host backend uses one); each one's :class:`HostStaging` is made once
        and returned again whenever that set is handed out, so the call is cheap and the views stay
        valid for as long as the executor's memory (they hold it). CUDA: call it before writing each
        step's inputs; it waits until the set it returns is no longer read by an earlier step."""
        staging: HostStaging = self._core.host_staging(_host_staging_of)
        return staging

    # ------------------------------------------------------------------ plans and statistics

    def plans(self, group: Optional[int] = None) -> List[BucketPlan]:
        """Every bucket's plan, bucket-major (index = bucket * bands + band), for each of
        :attr:`q_lens` in turn (``BucketPlan.q_len``), for every layer group in turn (group-major);
        or layer group ``group``'s only."""
        return [BucketPlan._from_core(d) for d in self._core.plans(group)]

    def plan_for(self, step_or_bucket: Union[StepResult, int], band: Optional[int] = None, *,
                 group: int = 0, q_len: Optional[int] = None) -> BucketPlan:
        """The plan a step ran (``plan_for(result)``, of the step's q_len), or of batch-bucket index
        ``bucket`` and band index ``band`` (``plan_for(bucket, band)``) for steps of ``q_len`` (None:
        the smallest of :attr:`q_lens`), for layer group ``group`` (0: layer 0's). A result
        whose band the graph chose on the device (band -1) raises InvalidArgument saying where to look:
        :meth:`plans_for` and ``stats().graphs[].band_replays``."""
        if isinstance(step_or_bucket, StepResult):
            r = step_or_bucket
            if q_len is not None and q_len != r.q_len:
                raise InvalidArgument(f"q_len = {q_len} is invalid; allowed: None or the step's q_len = {r.q_len}")
            return BucketPlan._from_core(
                self._core.plan_for_step(r.bucket, r.band, r.band_on_device, r.graph_id, group, r.q_len))
        if band is None:
            raise TypeError("plan_for(bucket, band): band is required with a bucket index")
        return BucketPlan._from_core(self._core.plan_for(int(step_or_bucket), int(band), group, q_len))

    @property
    def num_layer_groups(self) -> int:
        """Layer groups: layers with equal specs share one (1 without ``layer_specs``)."""
        return int(self._core.num_layer_groups)

    def layer_group(self, layer: int) -> int:
        """The layer group of layer ``layer``, numbered in the order of each group's first layer."""
        return int(self._core.layer_group(layer))

    def group_layers(self, group: int) -> List[int]:
        """The layers of layer group ``group``, ascending."""
        return list(self._core.group_layers(group))

    def layer_spec(self, layer: int) -> AttentionSpec:
        """Layer ``layer``'s spec (``config.layer_specs[layer]``, or ``config.spec``)."""
        self.layer_group(layer)  # checks the index
        return self._config.layer_spec(layer)

    def plans_for(self, bucket: int, *, group: int = 0, q_len: Optional[int] = None) -> List[BucketPlan]:
        """Every band's plan of batch-bucket index ``bucket``, in band order, for layer group ``group``,
        for steps of ``q_len`` (None: the smallest of :attr:`q_lens`)."""
        return [BucketPlan._from_core(d) for d in self._core.plans_for(int(bucket), group, q_len)]

    def plan_for_batch(self, batch_size: int, band: int, *, q_len: Optional[int] = None) -> BucketPlan:
        """The plan a step of ``batch_size`` sequences (1..max_batch) in band index ``band`` replays,
        of ``q_len`` query tokens per sequence (None: the smallest of :attr:`q_lens`)."""
        return BucketPlan._from_core(self._core.plan_for_batch(batch_size, band, q_len))

    def plan_table(self) -> str:
        """Every plan as an aligned text table."""
        return str(self._core.plan_table())

    def stats(self) -> ExecutorStats:
        """Capture, replay and staging counters (CUDA: waits for the last step)."""
        return ExecutorStats._from_core(self._core.stats())

    def memory(self) -> MemoryReport:
        """Bytes of static buffers, V2 workspace and graphs."""
        return MemoryReport(**self._core.memory())

    # ------------------------------------------------------------------ properties

    @property
    def config(self) -> ExecutorConfig:
        """The configuration as given (normalised; layers as last bound)."""
        return self._config

    @property
    def spec(self) -> AttentionSpec:
        return self._config.spec

    @property
    def num_layers(self) -> int:
        return int(self._core.num_layers)

    @property
    def q_lens(self) -> List[int]:
        """The query tokens per sequence graphs are captured for (``ExecutorConfig.q_lens``), ascending."""
        return list(self._core.q_lens)

    @property
    def backend(self) -> BackendKind:
        """The backend in effect: CUDA or HOST."""
        return self._core.backend

    @property
    def band_select(self) -> BandSelect:
        """The band choice in effect (DEVICE falls back to HOST where SWITCH nodes are missing)."""
        return self._core.band_select

    @property
    def stream(self) -> int:
        """The executor's own stream as an int handle (0 on the host backend)."""
        return int(self._core.stream)

    def __repr__(self) -> str:
        s = self.spec
        return (f"Executor(backend={self.backend.name.lower()}, layers={self.num_layers}, "
                f"heads={s.num_q_heads}/{s.num_kv_heads}, head_size={s.head_size}, "
                f"dtype={s.dtype.name.lower()}, layout={s.layout.name.lower()}, "
                f"max_batch={self._config.max_batch}, max_seq_len={self._config.max_seq_len}"
                + (f", q_lens={self.q_lens}" if self.q_lens != [1] else "") + ")")


def _host_staging_of(d: Dict[str, Any]) -> HostStaging:
    """One set of staging buffers as numpy views (the binding calls it once per set)."""
    import numpy as np

    return HostStaging(
        seq_lens=np.asarray(d["seq_lens"]),
        block_tables=np.asarray(d["block_tables"]),
        slot_mapping=np.asarray(d["slot_mapping"]),
        block_table_stride=int(d["block_table_stride"]),
    )


def _as_array(view: Any, dtype: Any, backend: BackendKind) -> ArrayView:
    """An executor-owned buffer as the backend's natural array type, zero-copy."""
    if backend is BackendKind.HOST:
        import numpy as np

        a = np.asarray(view)
        if dtype is DType.BF16:  # exported as uint16: numpy has no bfloat16 of its own
            import ml_dtypes

            a = a.view(ml_dtypes.bfloat16)
        return a
    try:
        import torch
    except ImportError:
        return cast(ArrayView, view)  # the binding's DLPack object
    return cast(ArrayView, torch.from_dlpack(view))
