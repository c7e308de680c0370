"""Eager calls: one attention or KV append at a time, on any DLPack-capable arrays.

Host arrays (numpy, torch CPU tensors) run the host implementation, the GIL released; CUDA arrays
(torch CUDA tensors, cupy, anything with ``__dlpack__`` or ``__cuda_array_interface__``) run the CUDA
kernels on ``stream``, asynchronously and capturable (nothing is allocated or read back). Every array
of a call lives on one device. The spec comes from the shapes: the layout from ``k_cache``'s rank
(5: vllm, 4: nhd), the dtype from ``q`` (fp16, bf16 or fp32; numpy bf16 is ``ml_dtypes.bfloat16``),
the cache dtype from ``k_cache``: the model dtype, or fp8 codes (numpy ``ml_dtypes.float8_e4m3fn`` /
``float8_e5m2``, torch ``float8_e4m3fn`` / ``float8_e5m2``, or uint8 with ``kv_cache_dtype``
``"fp8"`` / ``"fp8_e4m3"`` / ``"fp8_e5m2"``, vLLM's names). fp8 caches take float32 ``k_scale`` and
``v_scale`` of shape [1] (the layer's) or [num_kv_heads]: K = code * k_scale, V = code * v_scale.

Shapes:
    q, out          [num_seqs, num_q_heads, head_size]; rows may be strided (a multiple of 16 bytes
                    apart, e.g. q inside a fused QKV buffer), heads and elements packed. Speculative
                    decoding: [num_seqs, q_len, num_q_heads, head_size] (or q_len= with
                    [num_seqs * q_len, ...] rows, row s * q_len + j): row j of a sequence of L tokens
                    sits at position L - q_len + j and attends positions <= L - q_len + j
    k_cache         vllm: [num_blocks, num_kv_heads, head_size / x, block_size, x], x = 16 bytes /
                    element size (16 for fp8); nhd: [num_blocks, block_size, num_kv_heads, head_size]
    v_cache         vllm: [num_blocks, num_kv_heads, head_size, block_size]; nhd: as k_cache
    block_tables    int32 [num_seqs, max_blocks_per_seq], contiguous
    seq_lens        int32 [num_seqs], each 0 .. max_seq_len; 0 leaves that row of out untouched
    alibi_slopes    float32 [num_q_heads] or None
    key, value      [num_tokens, num_kv_heads, head_size] (rows may be strided), or
                    [num_seqs, q_len, num_kv_heads, head_size]
    slot_mapping    int64 [num_tokens] or [num_seqs, q_len]: block_id * block_size + offset;
                    negative skips the token
"""

from __future__ import annotations

from typing import Optional

from . import _core
from ._arrays import A, ArrayLike, StreamLike
from ._types import AttentionSpec


def paged_attention_v1(
    out: A,
    q: ArrayLike,
    k_cache: ArrayLike,
    v_cache: ArrayLike,
    block_tables: ArrayLike,
    seq_lens: ArrayLike,
    *,
    max_seq_len: int = 0,
    scale: float = 0.0,
    alibi_slopes: Optional[ArrayLike] = None,
    k_scale: Optional[ArrayLike] = None,
    v_scale: Optional[ArrayLike] = None,
    kv_cache_dtype: str = "auto",
    sliding_window: int = 0,
    logit_softcap: float = 0.0,
    sinks: Optional[ArrayLike] = None,
    q_len: Optional[int] = None,
    stream: StreamLike = None,
) -> A:
    """Single-pass paged decode attention (V1): ``out = softmax(scale * q K^T + alibi) V`` per
    sequence and query head, over the ``seq_lens[i]`` tokens of sequence i's blocks.

    Args:
        out: written, [num_seqs, num_q_heads, head_size] in q's dtype ([num_seqs, q_len, ...] or
            num_seqs * q_len rows with q_len > 1).
        q: [num_seqs, num_q_heads, head_size], or [num_seqs, q_len, num_q_heads, head_size].
        k_cache, v_cache: the layer's paged caches (see the module docstring for both layouts).
        block_tables: int32 [num_seqs, max_blocks_per_seq].
        seq_lens: int32 [num_seqs].
        max_seq_len: bound on every length (sizes the grid); 0 = block_tables.shape[1] * block_size.
        scale: softmax scale; 0 = 1/sqrt(head_size).
        alibi_slopes: float32 [num_q_heads], or None for no ALiBi (bias = slope * (pos - len + 1)).
        k_scale, v_scale: fp8 caches only (required there): float32 [1] or [num_kv_heads], on the
            arrays' device, read when the kernels run.
        kv_cache_dtype: ``"auto"`` (the caches' own dtype), or ``"fp8"``, ``"fp8_e4m3"``,
            ``"fp8_e5m2"`` for uint8 caches of raw codes.
        sliding_window: W (0: none), the Hugging Face convention: the query at p = len - 1 attends
            (p - W, p] (FlashInfer / FA ``window_left`` = W - 1); blocks before the window are never read.
        logit_softcap: c (0: off): each logit s becomes c * tanh(s / c), after scale and ALiBi.
        sinks: float32 [num_q_heads] raw logits (attention sinks), or None: in the softmax
            denominator only, read when the kernels run.
        q_len: query tokens per sequence, 1..16 (speculative decoding: 1 + drafts). None: q's
            shape[1] when q is 4-D, else 1; with 2-D or 3-D q, its rows are num_seqs * q_len
            (row s * q_len + j). Every seq_len must be 0 (padded) or at least q_len.
        stream: CUDA arrays only: an int cudaStream_t, a torch.cuda.Stream, or None (the legacy
            default stream). The call returns once the work is enqueued.

    Returns:
        ``out``.

    Raises:
        InvalidArgument: a bad array (naming it) or a bad length / block id (host arrays).
    """
    _core.paged_attention_v1(
        out, q, k_cache, v_cache, block_tables, seq_lens,
        max_seq_len=max_seq_len, scale=scale, alibi_slopes=alibi_slopes, k_scale=k_scale, v_scale=v_scale,
        kv_cache_dtype=kv_cache_dtype, sliding_window=sliding_window, logit_softcap=logit_softcap,
        sinks=sinks, q_len=q_len, stream=stream,
    )
    return out


def paged_attention_v2(
    out: A,
    q: ArrayLike,
    k_cache: ArrayLike,
    v_cache: ArrayLike,
    block_tables: ArrayLike,
    seq_lens: ArrayLike,
    *,
    partition_size: int,
    workspace: Optional[ArrayLike] = None,
    max_seq_len: int = 0,
    scale: float = 0.0,
    alibi_slopes: Optional[ArrayLike] = None,
    k_scale: Optional[ArrayLike] = None,
    v_scale: Optional[ArrayLike] = None,
    kv_cache_dtype: str = "auto",
    sliding_window: int = 0,
    logit_softcap: float = 0.0,
    sinks: Optional[ArrayLike] = None,
    q_len: Optional[int] = None,
    stream: StreamLike = None,
) -> A:
    """Two-pass paged decode attention (V2): pass 1 writes fp32 partials per partition of
    ``partition_size`` tokens, pass 2 merges them in a fixed order. Same result as V1 within rounding.

    Args:
        partition_size: tokens per partition, a positive multiple of block_size.
        workspace: uint8 [>= v2_workspace_size(spec, num_seqs, max_seq_len, partition_size,
            q_len=q_len)] on the arrays' device. Required for CUDA arrays; None on the host allocates one for the call.
        Others: as :func:`paged_attention_v1`.

    Returns:
        ``out``.
    """
    _core.paged_attention_v2(
        out, q, k_cache, v_cache, block_tables, seq_lens,
        partition_size=partition_size, workspace=workspace, max_seq_len=max_seq_len,
        scale=scale, alibi_slopes=alibi_slopes, k_scale=k_scale, v_scale=v_scale,
        kv_cache_dtype=kv_cache_dtype, sliding_window=sliding_window, logit_softcap=logit_softcap,
        sinks=sinks, q_len=q_len, stream=stream,
    )
    return out


def v2_workspace_size(spec: AttentionSpec, num_seqs: int, max_seq_len: int, partition_size: int, *,
                      q_len: int = 1) -> int:
    """Bytes of workspace :func:`paged_attention_v2` needs for ``num_seqs`` sequences of at most
    ``max_seq_len`` tokens at ``partition_size`` (fp32 max logits, exp sums and partial outputs),
    with ``q_len`` query rows per sequence (1..16; partials per row)."""
    return int(_core.v2_workspace_size(spec, num_seqs, max_seq_len, partition_size, q_len))


def append_kv(
    key: ArrayLike,
    value: ArrayLike,
    k_cache: ArrayLike,
    v_cache: ArrayLike,
    slot_mapping: ArrayLike,
    *,
    k_scale: Optional[ArrayLike] = None,
    v_scale: Optional[ArrayLike] = None,
    kv_cache_dtype: str = "auto",
    stream: StreamLike = None,
) -> None:
    """Writes each token's new K/V into the paged caches (vLLM's reshape_and_cache). fp8 caches
    store the code of x / scale: round to nearest even, saturated to +-max (448 E4M3, 57344 E5M2;
    +-inf too), NaN as 0x7f.

    Args:
        key, value: [num_tokens, num_kv_heads, head_size] in the caches' dtype (fp8 caches: fp16 or
            bf16, the model dtype), or [num_seqs, q_len, num_kv_heads, head_size] (a speculative
            step's tokens, token (s, j) the row s * q_len + j).
        k_scale, v_scale, kv_cache_dtype: as :func:`paged_attention_v1`.
        k_cache, v_cache: written; the layout follows from k_cache's rank.
        slot_mapping: int64 [num_tokens], or [num_seqs, q_len] (required shape for 4-D key and
            value; allowed with num_seqs * q_len = num_tokens for 3-D ones); slot = block_id *
            block_size + offset, negative = skip.
            Host arrays: a slot past the cache raises InvalidArgument (CUDA: it is skipped).
        stream: as :func:`paged_attention_v1`.
    """
    _core.append_kv(key, value, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale,
                    kv_cache_dtype=kv_cache_dtype, stream=stream)
