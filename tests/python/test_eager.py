"""Eager V1 / V2 / append_kv on the host backend (numpy arrays) against the float64 numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

import decodegraph as dg
import reference as ref
from conftest import NP_DTYPE, make_problem, random_array

DTYPES = ["fp16", "bf16", "fp32"]
LAYOUTS = ["vllm", "nhd"]
GQA = [(4, 4), (8, 2), (8, 1)]  # query heads per KV head: 1, 4, 8


def run_v1(p, **kw):
    out = p.out()
    r = dg.paged_attention_v1(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, **kw)
    assert r is out
    return out


def run_v2(p, partition_size, **kw):
    out = p.out()
    dg.paged_attention_v2(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens,
                          partition_size=partition_size, **kw)
    return out


def expected(p, **kw):
    return ref.attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.layout,
                         p.spec.block_size, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("hq,hkv", GQA)
def test_v1_v2_irregular_lengths_batch7(rng, dtype, layout, hq, hkv):
    bs = 16
    # batch 7: 1, block - 1, block, block + 1, partition - 1, partition, partition + 1 (P = 64)
    p = make_problem(rng, dtype=dtype, layout=layout, hq=hq, hkv=hkv, d=64, bs=bs,
                     lens=[1, bs - 1, bs, bs + 1, 63, 64, 65])
    want = expected(p)
    ref.check_close(run_v1(p), want, dtype, "V1")
    ref.check_close(run_v2(p, 64), want, dtype, "V2 P=64")
    ref.check_close(run_v2(p, 16), want, dtype, "V2 P=16")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch17_random_lengths(rng, dtype, layout):
    lens = rng.integers(1, 700, size=17)
    p = make_problem(rng, dtype=dtype, layout=layout, hq=8, hkv=2, d=128, bs=32, lens=lens)
    want = expected(p)
    ref.check_close(run_v1(p), want, dtype, "V1")
    ref.check_close(run_v2(p, 256), want, dtype, "V2 P=256")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_long_lengths_many_partitions(rng, dtype, layout):
    # 8191..8193: the default V1/V2 threshold's neighbours; P = 512 gives 16-17 partitions.
    p = make_problem(rng, dtype=dtype, layout=layout, hq=4, hkv=1, d=64, bs=16, lens=[8191, 8192, 8193])
    want = expected(p)
    ref.check_close(run_v2(p, 512), want, dtype, "V2 P=512")
    ref.check_close(run_v1(p), want, dtype, "V1")


@pytest.mark.parametrize("head_size", dg.SUPPORTED_HEAD_SIZES)
@pytest.mark.parametrize("bs", dg.SUPPORTED_BLOCK_SIZES)
def test_head_and_block_sizes(rng, head_size, bs):
    p = make_problem(rng, dtype="bf16", layout="vllm", hq=4, hkv=2, d=head_size, bs=bs, lens=[1, bs + 1, 3 * bs - 1])
    ref.check_close(run_v2(p, 2 * bs), expected(p), "bf16")


def test_scale_alibi_and_padded_row(rng):
    p = make_problem(rng, dtype="fp32", layout="nhd", hq=8, hkv=2, d=64, bs=16, lens=[40, 0, 130])
    slopes = (2.0 ** (-8.0 * np.arange(1, 9) / 8)).astype(np.float32)
    want = expected(p, scale=0.3, alibi=slopes)
    for out in (run_v1(p, scale=0.3, alibi_slopes=slopes), run_v2(p, 32, scale=0.3, alibi_slopes=slopes)):
        ref.check_close(out, want, "fp32")
        assert np.isnan(out[1]).all(), "a row with seq_len 0 is left untouched"


def test_large_logits(rng):
    # |q|, |k| ~ 10: logits in the hundreds stress the max subtraction.
    p = make_problem(rng, dtype="fp32", layout="vllm", hq=4, hkv=1, d=64, bs=16, lens=[300, 77])
    p.q *= 10
    p.k_cache *= 10
    want = expected(p)
    atol, rtol = 5e-4, 5e-4  # fp32 logits of ~1e3 carry ~1e-4 absolute error into the weights
    for out in (run_v1(p), run_v2(p, 64)):
        np.testing.assert_allclose(out.astype(np.float64), want, atol=atol, rtol=rtol)


def test_fused_qkv_rows_are_strided(rng):
    # q and out as slices of wider rows (a fused QKV buffer): row stride != num_q_heads * head_size.
    p = make_problem(rng, dtype="fp16", layout="vllm", hq=4, hkv=2, d=64, bs=16, lens=[5, 70, 16])
    qkv = random_array(rng, (3, (4 + 2 * 2) * 64), "fp16")
    qkv[:, :256] = p.q.reshape(3, 256)
    q = qkv[:, :256].reshape(3, 4, 64)  # rows 512 elements apart
    out_wide = np.full((3, 384), np.nan, dtype=np.float16)
    out = out_wide[:, :256].reshape(3, 4, 64)
    assert np.shares_memory(q, qkv) and np.shares_memory(out, out_wide)
    dg.paged_attention_v1(out, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    ref.check_close(out, expected(p), "fp16")
    assert np.isnan(out_wide[:, 256:]).all(), "nothing written past the view's columns"


def test_v2_workspace_size_and_given_workspace(rng):
    p = make_problem(rng, dtype="fp32", lens=[100, 200, 300], width=20)
    size = dg.v2_workspace_size(p.spec, 3, 320, 64)
    # Three fp32 sub-buffers for 3 seqs x 4 heads x 5 partitions, at least the partial outputs.
    assert size >= 3 * 4 * 5 * 64 * 4
    ws = np.zeros(size, dtype=np.uint8)
    out = p.out()
    dg.paged_attention_v2(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, partition_size=64,
                          workspace=ws, max_seq_len=320)
    ref.check_close(out, expected(p), "fp32")
    assert ws.any(), "the workspace was used"
    with pytest.raises(dg.InvalidArgument, match="workspace.nbytes"):
        dg.paged_attention_v2(out, p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens,
                              partition_size=64, workspace=ws[: size // 2], max_seq_len=320)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_append_kv(rng, dtype, layout):
    spec = dg.AttentionSpec(num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16, dtype=dtype, layout=layout)
    nb = 9
    k_cache = random_array(rng, spec.k_cache_shape(nb), dtype)
    v_cache = random_array(rng, spec.v_cache_shape(nb), dtype)
    key = random_array(rng, (6, 2, 64), dtype)
    value = random_array(rng, (6, 2, 64), dtype)
    slots = np.array([0, 15, 16, 143, -1, 77], dtype=np.int64)
    want_k, want_v = k_cache.copy(), v_cache.copy()
    ref.append(want_k, want_v, layout, key, value, slots, 16)
    dg.append_kv(key, value, k_cache, v_cache, slots)
    # A copy: bitwise equal, the skipped token (-1) included.
    np.testing.assert_array_equal(k_cache.view(np.uint8), want_k.view(np.uint8))
    np.testing.assert_array_equal(v_cache.view(np.uint8), want_v.view(np.uint8))


def test_append_then_attend(rng):
    # The eager pair a decode step runs: append the new token, then attend over it.
    p = make_problem(rng, dtype="bf16", layout="nhd", hq=8, hkv=1, d=128, bs=8, lens=[9, 1, 24])
    key = random_array(rng, (3, 1, 128), "bf16")
    value = random_array(rng, (3, 1, 128), "bf16")
    pos = p.seq_lens.astype(np.int64) - 1
    slots = p.block_tables[np.arange(3), pos // 8].astype(np.int64) * 8 + pos % 8
    dg.append_kv(key, value, p.k_cache, p.v_cache, slots)
    out = run_v1(p)
    ref.check_close(out, expected(p), "bf16")
    # The new token is in the cache: attention with only it (len 1) returns its value.
    np.testing.assert_array_equal(out[1, 0].view(np.uint16), value[1, 0].view(np.uint16))


def test_numpy_dtype_helper():
    assert dg.numpy_dtype("bf16") == np.dtype(NP_DTYPE["bf16"])
    assert dg.numpy_dtype(dg.DType.FP16) == np.float16
    assert dg.AttentionSpec(dtype=np.float32).dtype is dg.DType.FP32
