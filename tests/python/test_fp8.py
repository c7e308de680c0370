"""fp8 KV caches through the binding on the host backend: numpy ml_dtypes float8 caches (and uint8
codes with kv_cache_dtype), eager V1 / V2 and the quantising append against the float64 numpy
reference, the executor with per-layer scales that a replay reads anew, and the errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import decodegraph as dg
import reference as ref
from conftest import NP_DTYPE, make_problem, slots_for

FP8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}
MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


def head_axis(layout: str, key: bool) -> int:
    return 1 if layout == "vllm" else 2


def scaled(cache: np.ndarray, scale: np.ndarray, layout: str, key: bool) -> np.ndarray:
    """float64 values of a code cache times its scales (one, or one per KV head)."""
    vals = cache.astype(np.float64)
    if scale.size == 1:
        return vals * float(scale[0])
    shape = [1] * vals.ndim
    shape[head_axis(layout, key)] = scale.size
    return vals * scale.astype(np.float64).reshape(shape)


def fp8_problem(rng, kv: str, dtype: str, layout: str, per_head: bool, hq=8, hkv=2, d=64, bs=16,
                lens=(1, 15, 17, 200)):
    """A problem whose caches are fp8 codes of values in [-1, 1) at scales 1/100 (K) and 1/300 (V)."""
    p = make_problem(rng, dtype=dtype, layout=layout, hq=hq, hkv=hkv, d=d, bs=bs, lens=lens)
    p.spec = dg.AttentionSpec(num_q_heads=hq, num_kv_heads=hkv, head_size=d, block_size=bs, dtype=dtype,
                              layout=layout, kv_dtype=kv, kv_scale_per_head=per_head)
    n = hkv if per_head else 1
    ks = (np.arange(1, n + 1) / 100.0).astype(np.float32)
    vs = (np.arange(1, n + 1) / 300.0).astype(np.float32)
    k = rng.uniform(-1, 1, p.spec.k_cache_shape(p.num_blocks))
    v = rng.uniform(-1, 1, p.spec.v_cache_shape(p.num_blocks))
    p.k_cache = (k / scaled(np.ones_like(k), ks, layout, True)).astype(FP8[kv])
    p.v_cache = (v / scaled(np.ones_like(v), vs, layout, False)).astype(FP8[kv])
    return p, ks, vs


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
@pytest.mark.parametrize("per_head", [False, True])
def test_eager_against_reference(rng, kv, dtype, layout, per_head):
    p, ks, vs = fp8_problem(rng, kv, dtype, layout, per_head)
    assert p.k_cache.shape == p.spec.k_cache_shape(p.num_blocks)
    assert dg.kv_numpy_dtype(p.spec) == np.dtype(FP8[kv])
    want = ref.attention(p.q, scaled(p.k_cache, ks, layout, True), scaled(p.v_cache, vs, layout, False),
                         p.block_tables, p.seq_lens, layout, p.spec.block_size)
    out = p.out()
    dg.paged_attention_v1(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, k_scale=ks, v_scale=vs)
    ref.check_close(out, want, dtype, "V1")
    out = p.out()
    dg.paged_attention_v2(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, partition_size=64,
                          k_scale=ks, v_scale=vs)
    ref.check_close(out, want, dtype, "V2")
    # uint8 codes (vLLM's storage) with the cache dtype named.
    out = p.out()
    dg.paged_attention_v1(out, p.q, p.k_cache.view(np.uint8), p.v_cache.view(np.uint8), p.block_tables,
                          p.seq_lens, k_scale=ks, v_scale=vs, kv_cache_dtype=kv)
    ref.check_close(out, want, dtype, "V1 uint8 codes")


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_append_quantises(rng, kv, layout):
    spec = dg.AttentionSpec(num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype="bf16",
                            layout=layout, kv_dtype=kv)
    nb = 4
    kc = np.zeros(spec.k_cache_shape(nb), FP8[kv])
    vc = np.zeros(spec.v_cache_shape(nb), FP8[kv])
    key = rng.uniform(-3, 3, (5, 2, 64)).astype(ml_dtypes.bfloat16)
    value = rng.uniform(-3, 3, (5, 2, 64)).astype(ml_dtypes.bfloat16)
    key[0, 0, 0] = 1e5  # 1e5 / scale is past both maxima (448, 57344): saturates, never inf
    slots = np.array([3, 20, -1, 63, 40], np.int64)
    ks, vs = np.array([0.5], np.float32), np.array([0.01], np.float32)
    dg.append_kv(key, value, kc, vc, slots, k_scale=ks, v_scale=vs)
    kq = np.zeros_like(kc)
    vq = np.zeros_like(vc)
    # In range, ml_dtypes rounds float32 to nearest even as the library does.
    kx = (key.astype(np.float32) / ks[0]).clip(-MAX[kv], MAX[kv]).astype(FP8[kv])
    vx = (value.astype(np.float32) / vs[0]).clip(-MAX[kv], MAX[kv]).astype(FP8[kv])
    ref.append(kq, vq, layout, kx, vx, slots, 16)
    assert np.array_equal(kc.view(np.uint8), kq.view(np.uint8))
    assert np.array_equal(vc.view(np.uint8), vq.view(np.uint8))
    assert float(kx[0, 0, 0].astype(np.float32)) == MAX[kv]


def test_executor_scales_read_at_every_replay(rng):
    p, ks, vs = fp8_problem(rng, "fp8_e4m3", "bf16", "vllm", True, lens=(30, 100, 7))
    ks = ks.copy()
    vs = vs.copy()
    layers = [dg.LayerBuffers(p.k_cache, p.v_cache, k_scale=ks, v_scale=vs)]
    ex = dg.Executor(spec=p.spec, layers=layers, max_batch=4, max_seq_len=256, backend="host", append_kv=False)
    ex.query(0)[:3] = p.q
    r = ex.step(p.seq_lens, p.block_tables)
    assert r.captured

    def want():
        return ref.attention(p.q, scaled(p.k_cache, ks, "vllm", True), scaled(p.v_cache, vs, "vllm", False),
                             p.block_tables, p.seq_lens, "vllm", 16)

    ref.check_close(np.asarray(ex.output(0)[:3]).astype(np.float64), want(), "bf16", "first step")
    before = np.asarray(ex.output(0)[:3]).astype(np.float64).copy()
    captures = ex.stats().total_captures
    ks *= 3  # the same arrays, new values: the next replay reads them
    vs[1] *= 0.5
    r = ex.step(p.seq_lens, p.block_tables)
    assert not r.captured and ex.stats().total_captures == captures
    after = np.asarray(ex.output(0)[:3]).astype(np.float64)
    assert not np.array_equal(before, after)
    ref.check_close(after, want(), "bf16", "replay after new scales")


def test_errors_name_the_argument(rng):
    p, ks, vs = fp8_problem(rng, "fp8_e5m2", "fp16", "nhd", False)
    out = p.out()
    with pytest.raises(dg.InvalidArgument, match="k_scale = None"):
        dg.paged_attention_v1(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, v_scale=vs)
    with pytest.raises(dg.InvalidArgument, match="k_scale\\[0\\] = 0"):
        dg.paged_attention_v1(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens,
                              k_scale=np.zeros(1, np.float32), v_scale=vs)
    with pytest.raises(dg.InvalidArgument, match="fp32 with kv_dtype fp8_e5m2"):
        dg.paged_attention_v1(out.astype(np.float32), p.q.astype(np.float32), p.k_cache, p.v_cache,
                              p.block_tables, p.seq_lens, k_scale=ks, v_scale=vs)
    with pytest.raises(dg.InvalidArgument, match="kv_cache_dtype"):
        dg.paged_attention_v1(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, k_scale=ks,
                              v_scale=vs, kv_cache_dtype="fp8_e4m3")
    with pytest.raises(dg.InvalidArgument, match="k_cache.dtype"):
        dg.paged_attention_v1(out, p.q, p.k_cache.view(np.uint8), p.v_cache.view(np.uint8), p.block_tables,
                              p.seq_lens, k_scale=ks, v_scale=vs)
    with pytest.raises(dg.InvalidArgument, match="layers\\[0\\].k_scale"):
        dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(p.k_cache, p.v_cache, v_scale=vs)], max_batch=4,
                    max_seq_len=256, backend="host")
    with pytest.raises(dg.InvalidArgument, match="spec.kv_dtype"):
        dg.AttentionSpec(kv_dtype="fp8_e4m3fnuz")
    assert dg.AttentionSpec(kv_dtype="fp8").kv_dtype is dg.KVCacheDType.FP8_E4M3
    assert dg.AttentionSpec(kv_dtype=ml_dtypes.float8_e5m2).kv_dtype is dg.KVCacheDType.FP8_E5M2
    assert dg.AttentionSpec(kv_dtype="fp8", layout="vllm").k_cache_shape(2) == (2, 8, 8, 16, 16)
