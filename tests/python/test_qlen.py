"""Speculative decoding through the binding (q_len query rows per sequence, issue 18), on the host:
eager V1 / V2 / append and executor steps against the float64 numpy reference (reference.attention_rows,
and row j against the single-token reference at length L - n + 1 + j), a draft-verify loop, and the
bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import decodegraph as dg
import reference as ref
from conftest import host_executor, make_problem, random_array

# |out - ref| <= atol + rtol |ref|. Each of the n rows of a sequence runs the single-token math (fp32
# logits, softmax and sums over at most 3001 tokens), then one rounding into the output dtype.
#  rtol: that rounding, half an ulp relative (fp16 2^-11, bf16 2^-8) with 1 % slack; fp32 outputs
#        are not rounded: 1e-5 for the fp32 sums' relative error.
#  atol: the kernels' error near zero. fp16 / bf16 carry the softmax weights as hi + lo in the model
#        dtype (kernels/host_attention.cpp): 22 / 16 significant bits, so ~2^-23 / 2^-17 of the O(1)
#        values summed; measured at most 2.2e-7 (fp16) and 2.4e-6 (bf16) beyond rtol |ref| over this
#        file, and 2.7e-7 for fp32. About 4x that.
TOL = {
    "fp32": (1e-6, 1e-5),
    "fp16": (1e-6, 1.01 * 2.0**-11),
    "bf16": (1e-5, 1.01 * 2.0**-8),
}
Q_LENS = [1, 2, 3, 4, 5, 8]
GQA = [(4, 4), (8, 2), (8, 1)]  # query heads per KV head: 1, 4, 8
DTYPE_LAYOUT = [("fp32", "vllm"), ("fp16", "nhd"), ("bf16", "vllm"), ("bf16", "nhd")]
BS = 16


def lengths(n: int) -> list[int]:
    """n and n + 1 (the shortest a step of n allows), a block - 1, a block, a block + 1, 127 and a
    few thousand."""
    return [n, n + 1, BS - 1, BS, BS + 1, 127, 3001]


def slot_rows(tables: np.ndarray, lens: np.ndarray, n: int, bs: int) -> np.ndarray:
    """int64 [num_seqs, n]: entry (i, j) is the slot of position lens[i] - n + j."""
    pos = lens.astype(np.int64)[:, None] - n + np.arange(n)
    return tables[np.arange(len(lens))[:, None], pos // bs].astype(np.int64) * bs + pos % bs


def check_rows(out, q, k_cache, v_cache, tables, lens, layout, dtype, what, single=True, **kw) -> None:
    """``out`` [num_seqs, n, heads, head_size] against attention_rows, and (``single``) each row j
    against the single-token reference at length L - n + 1 + j (the query at position L - n + j)."""
    n = q.shape[1]
    ref.check_close(out, ref.attention_rows(q, k_cache, v_cache, tables, lens, layout, BS, **kw), dtype,
                    what, tol=TOL[dtype])
    for j in range(n if single else 0):
        one = np.where(lens > 0, lens - n + 1 + j, 0).astype(np.int32)
        want = ref.attention(q[:, j], k_cache, v_cache, tables, one, layout, BS, **kw)
        ref.check_close(out[:, j], want, dtype, f"{what}, row {j} as one token at L - n + 1 + j", tol=TOL[dtype])


def reference_self_check(rng) -> None:
    """attention_rows' row j is the single-token reference at L - n + 1 + j (float64 on both sides):
    guards the reference itself, windows, ALiBi, soft-cap and sinks included."""
    p = make_problem(rng, dtype="fp32", hq=4, hkv=2, d=64, bs=BS, lens=[5, 40, 100])
    q = random_array(rng, (3, 5, 4, 64), "fp32")
    slopes = rng.uniform(0.01, 0.5, size=4)
    sinks = rng.uniform(-1, 2, size=4)
    for kw in ({}, dict(window=7, alibi=slopes, softcap=4.0, sinks=sinks)):
        rows = ref.attention_rows(q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, "vllm", BS, **kw)
        for j in range(5):
            one = ref.attention(q[:, j], p.k_cache, p.v_cache, p.block_tables, p.seq_lens - 4 + j, "vllm", BS, **kw)
            np.testing.assert_allclose(rows[:, j], one, rtol=1e-12, atol=1e-14)


def test_reference_rows_are_single_tokens(rng):
    reference_self_check(rng)


# ------------------------------------------------------------------ eager

@pytest.mark.parametrize("dtype,layout", DTYPE_LAYOUT)
@pytest.mark.parametrize("hq,hkv", GQA)
@pytest.mark.parametrize("n", Q_LENS)
def test_eager_rows_match_reference(rng, dtype, layout, hq, hkv, n):
    lens = lengths(n)
    p = make_problem(rng, dtype=dtype, layout=layout, hq=hq, hkv=hkv, d=64, bs=BS, lens=lens)
    q = random_array(rng, (p.n, n, hq, 64), dtype)
    args = (q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    out = np.full(q.shape, np.nan, dtype=q.dtype)
    assert dg.paged_attention_v1(out, *args) is out
    check_rows(out, *args, layout, dtype, f"V1 n={n}")
    for P in (32, 64):
        out = np.full(q.shape, np.nan, dtype=q.dtype)
        dg.paged_attention_v2(out, *args, partition_size=P)
        check_rows(out, *args, layout, dtype, f"V2 P={P} n={n}")


def test_rows_without_the_causal_mask_fail_the_check(rng):
    # The checks above can fail: every row attending all L tokens (no causal mask), or the rows read
    # as sequences of their own, is far outside the tolerance.
    p = make_problem(rng, dtype="bf16", hq=8, hkv=2, d=64, bs=BS, lens=[4, 20, 300])
    q = random_array(rng, (3, 4, 8, 64), "bf16")
    out = dg.paged_attention_v1(np.full(q.shape, np.nan, q.dtype), q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    check_rows(out, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, "vllm", "bf16", "causal")
    for j in range(3):  # rows 0..2 see fewer tokens than L; row 3 sees all of them
        full = ref.attention(q[:, j], p.k_cache, p.v_cache, p.block_tables, p.seq_lens, "vllm", BS)
        with pytest.raises(AssertionError, match="out of tolerance"):
            ref.check_close(out[:, j], full, "bf16", "no mask", tol=TOL["bf16"])


@pytest.mark.parametrize("n", [2, 5])
def test_eager_q_len_argument_flat_rows_and_padded_sequence(rng, n):
    # 3-D q of num_seqs * n rows with q_len=n, a caller workspace sized by v2_workspace_size(q_len=n),
    # and a padded sequence (length 0) whose rows stay untouched.
    lens = [n, 0, 300]
    p = make_problem(rng, dtype="fp16", layout="nhd", hq=8, hkv=2, d=128, bs=BS, lens=lens)
    q = random_array(rng, (3, n, 8, 128), "fp16")
    for v2 in (False, True):
        out = np.full((3 * n, 8, 128), np.nan, dtype=np.float16)
        args = (out, q.reshape(3 * n, 8, 128), p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
        if v2:
            ws_size = dg.v2_workspace_size(p.spec, 3, 304, 64, q_len=n)
            assert ws_size > dg.v2_workspace_size(p.spec, 3, 304, 64), "partials per row"
            dg.paged_attention_v2(*args, q_len=n, partition_size=64, max_seq_len=304,
                                  workspace=np.zeros(ws_size, np.uint8))
        else:
            dg.paged_attention_v1(*args, q_len=n)
        got = out.reshape(3, n, 8, 128)
        assert np.isnan(got[1].astype(np.float64)).all(), "padded sequence's rows untouched"
        check_rows(got, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, "nhd", "fp16", f"v2={v2}")


def test_eager_strided_q_in_fused_buffer(rng):
    # q [num_seqs, n, heads, head_size] inside a fused QKV buffer: rows (s, j) evenly strided.
    n, hq, hkv, d = 4, 8, 2, 64
    p = make_problem(rng, dtype="bf16", hq=hq, hkv=hkv, d=d, bs=BS, lens=[4, 33, 700])
    fused = random_array(rng, (3, n, (hq + 2 * hkv) * d), "bf16")
    q = fused[:, :, : hq * d].reshape(3, n, hq, d)
    assert not q.flags.c_contiguous
    out = np.full((3, n, hq, d), np.nan, dtype=q.dtype)
    dg.paged_attention_v2(out, q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, partition_size=128)
    check_rows(out, np.ascontiguousarray(q), p.k_cache, p.v_cache, p.block_tables, p.seq_lens, "vllm", "bf16", "fused")


def free_before_window(p, n: int, window: int) -> None:
    """NaN in every block wholly before the first position any row reads (row 0's window start,
    L - n - W + 1), its table entry -1 (vLLM's freed blocks): reading either fails the test."""
    for i, length in enumerate(p.seq_lens):
        first = max(0, int(length) - n - window + 1)
        for j in range(first // BS):
            blk = p.block_tables[i, j]
            p.k_cache[blk] = np.nan
            p.v_cache[blk] = np.nan
            p.block_tables[i, j] = -1


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("window", [1, 5, 16, 40])
@pytest.mark.parametrize("n", [3, 8])
def test_eager_window_alibi_softcap_sinks(rng, dtype, window, n):
    lens = [n, n + window - 1, n + window, BS + 1, 2 * window + n + 3, 300]
    p = make_problem(rng, dtype=dtype, hq=8, hkv=2, d=64, bs=BS, lens=lens, spare_blocks=0)
    free_before_window(p, n, window)
    q = random_array(rng, (p.n, n, 8, 64), dtype)
    slopes = (2.0 ** (-8.0 * np.arange(1, 9) / 8)).astype(np.float32)
    sinks = rng.uniform(-1.0, 4.0, size=8).astype(np.float32)
    sinks[2] = -np.inf  # no sink on one head
    kw = dict(sliding_window=window, logit_softcap=5.0, sinks=sinks, alibi_slopes=slopes)
    rkw = dict(window=window, softcap=5.0, sinks=sinks, alibi=slopes)
    args = (q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    out = dg.paged_attention_v1(np.full(q.shape, np.nan, q.dtype), *args, **kw)
    check_rows(out, *args, "vllm", dtype, "V1", **rkw)
    out = dg.paged_attention_v2(np.full(q.shape, np.nan, q.dtype), *args, partition_size=16, **kw)
    check_rows(out, *args, "vllm", dtype, "V2", **rkw)


@pytest.mark.parametrize("layout", ["vllm", "nhd"])
@pytest.mark.parametrize("flat", [False, True])
def test_eager_append_rows(rng, layout, flat):
    # key/value [num_seqs, q_len, ...] (or flattened to rows) with slot_mapping [num_seqs, q_len],
    # negative entries skipped: the caches bitwise as the reference's append.
    n = 4
    p = make_problem(rng, dtype="bf16", layout=layout, hq=4, hkv=2, d=64, bs=BS, lens=[4, 17, 60])
    key = random_array(rng, (3, n, 2, 64), "bf16")
    value = random_array(rng, (3, n, 2, 64), "bf16")
    slots = slot_rows(p.block_tables, p.seq_lens, n, BS)
    slots[1, 2] = -1
    slots[2, 0] = -7
    kc, vc = p.k_cache.copy(), p.v_cache.copy()
    ref.append(kc, vc, layout, key.reshape(-1, 2, 64), value.reshape(-1, 2, 64), slots.reshape(-1), BS)
    k_in = key.reshape(3 * n, 2, 64) if flat else key
    v_in = value.reshape(3 * n, 2, 64) if flat else value
    dg.append_kv(k_in, v_in, p.k_cache, p.v_cache, slots)
    np.testing.assert_array_equal(p.k_cache.view(np.uint16), kc.view(np.uint16))
    np.testing.assert_array_equal(p.v_cache.view(np.uint16), vc.view(np.uint16))


# ------------------------------------------------------------------ executor

class SpecLoop:
    """Drives an executor of several q_lens beside a numpy model of its caches: every step checks
    every layer's output rows and both caches bitwise."""

    def __init__(self, ex: dg.Executor, p, rng, **ref_kw):
        self.ex, self.p, self.rng, self.ref_kw = ex, p, rng, ref_kw
        self.model = [(lb.k_cache.copy(), lb.v_cache.copy()) for lb in ex.config.layers]

    def step(self, lens, tables, n, slots=None, **kw) -> dg.StepResult:
        p, ex, rng = self.p, self.ex, self.rng
        lens = np.asarray(lens, dtype=np.int32)
        s = len(lens)
        slots = slot_rows(tables, lens, n, BS) if slots is None else slots
        qs, keys, values = [], [], []
        for layer in range(ex.num_layers):
            sp = ex.layer_spec(layer)
            q = random_array(rng, (s, n, sp.num_q_heads, sp.head_size), p.dtype)
            k = random_array(rng, (s, n, sp.num_kv_heads, sp.head_size), p.dtype)
            v = random_array(rng, (s, n, sp.num_kv_heads, sp.head_size), p.dtype)
            ex.query(layer, n)[:s] = q
            ex.new_key(layer, n)[:s] = k
            ex.new_value(layer, n)[:s] = v
            qs.append(q), keys.append(k), values.append(v)
        r = ex.step(lens, tables, slots, q_len=n, **kw)
        assert r.q_len == n
        for layer in range(ex.num_layers):
            kc, vc = self.model[layer]
            hkv, d = keys[layer].shape[2:]
            ref.append(kc, vc, p.layout, keys[layer].reshape(-1, hkv, d), values[layer].reshape(-1, hkv, d),
                       np.asarray(slots).reshape(-1), BS)
            lb = ex.config.layers[layer]
            np.testing.assert_array_equal(lb.k_cache.view(np.uint8), kc.view(np.uint8), "K after append")
            np.testing.assert_array_equal(lb.v_cache.view(np.uint8), vc.view(np.uint8), "V after append")
            # The single-token form for layer 0 only: the reference's rows are checked against it
            # there and in the eager tests; the other layers' rows against attention_rows.
            check_rows(ex.output(layer, n)[:s], qs[layer], kc, vc, tables, lens, p.layout, p.dtype,
                       f"layer {layer} n={n}", single=layer == 0, **self.ref_kw)
        return r


KERNELS = [  # (kernel forced, band_select)
    ("v1", "host"),    # policy threshold, v2_threshold = max_seq_len: V1 in every band
    ("v2", "host"),    # policy threshold, v2_threshold 16: V2 above 16 tokens (every step here)
    ("v2", "device"),
]


def forced(kernel: str, max_seq_len: int) -> dict:
    if kernel == "v1":
        return dict(policy="threshold", v2_threshold=max_seq_len)
    return dict(policy="threshold", v2_threshold=16, partition_size=64)


@pytest.mark.parametrize("dtype,layout", DTYPE_LAYOUT)
@pytest.mark.parametrize("hq,hkv", GQA)
@pytest.mark.parametrize("kernel,band_select", KERNELS)
def test_executor_steps_of_every_q_len(rng, dtype, layout, hq, hkv, kernel, band_select):
    cap = lengths(max(Q_LENS))
    p = make_problem(rng, dtype=dtype, layout=layout, hq=hq, hkv=hkv, d=64, bs=BS, lens=cap)
    max_seq_len = int(p.block_tables.shape[1]) * BS
    ex = host_executor(p, max_batch=len(cap), q_lens=[8, 1, 4, 2, 5, 3], band_select=band_select,
                       **forced(kernel, max_seq_len))
    assert ex.q_lens == Q_LENS, "ascending"
    assert ex.query(0).shape == (len(cap) * 8, hq, 64), "every row: max_batch x max(q_lens)"
    loop = SpecLoop(ex, p, rng)
    for n in rng.permutation(Q_LENS):
        n = int(n)
        r = loop.step(lengths(n), p.block_tables, n)
        assert r.kernel is (dg.KernelKind.V1 if kernel == "v1" else dg.KernelKind.V2), (n, r)
        assert ex.plan_for(r).q_len == n and ex.plan_for(r).kernel is r.kernel
    graphs = ex.stats().graphs
    assert sorted(g.q_len for g in graphs) == Q_LENS, "a graph per q_len, none shared"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("band_select", ["device", "host"])
def test_verify_loop_k3(rng, dtype, band_select):
    # EAGLE-like: q_lens [1, 4]; each step drafts k = 3 (n = 4) or, now and then, none (n = 1), and
    # accepts 0..3 drafts at random; lengths advance by 1..4 across block edges and the band edge
    # 2048. The next step's rows overwrite the rejected drafts' slots.
    committed = np.array([1, 14, 16, 200, 2044])
    steps = 40
    p = make_problem(rng, dtype=dtype, layout="vllm", hq=8, hkv=2, d=64, bs=BS,
                     lens=list(committed + 4 * steps + 4))
    ex = host_executor(p, layers=2, max_batch=5, q_lens=[1, 4], band_select=band_select)
    loop = SpecLoop(ex, p, rng)
    seen = set()
    for _ in range(steps):
        n = 4 if rng.random() < 0.75 else 1
        lens = committed + n  # the last verified token and the drafts
        r = loop.step(lens, p.block_tables, n)
        seen.add((n, r.kernel))
        committed = committed + 1 + (rng.integers(0, 4, size=5) if n == 4 else 0)
    assert {n for n, _ in seen} == {1, 4}


@pytest.mark.parametrize("window", [5, 40])
def test_executor_window_alibi_softcap_sinks(rng, window):
    # Blocks wholly before what row 0 of the longest step reads are freed (NaN, table entry -1).
    lens = [8, 8 + window, 2 * window + 9, 300]
    p = make_problem(rng, dtype="bf16", hq=8, hkv=2, d=64, bs=BS, lens=lens, spare_blocks=0)
    free_before_window(p, 8, window)
    spec = dataclasses.replace(p.spec, sliding_window=window, logit_softcap=5.0)
    sinks = rng.uniform(-1.0, 4.0, size=8).astype(np.float32)
    slopes = rng.uniform(0.01, 0.3, size=8).astype(np.float32)
    layers = [dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy(), sinks=sinks)]
    ex = dg.Executor(spec=spec, layers=layers, max_batch=4, max_seq_len=int(p.block_tables.shape[1]) * BS,
                     q_lens=[1, 3, 8], alibi_slopes=slopes, backend="host")
    loop = SpecLoop(ex, p, rng, window=window, softcap=5.0, sinks=sinks, alibi=slopes)
    for n in (8, 1, 3):
        loop.step(lens, p.block_tables, n)


def test_skipped_slots_and_staging_buffers(rng):
    # A negative entry of slot_mapping [num_seqs, q_len] skips that token's append: attention then
    # reads the cache's old contents there. Inputs written into host_staging() (slot_mapping of
    # max_batch x max(q_lens) entries) run the same.
    p = make_problem(rng, dtype="fp16", hq=4, hkv=1, d=64, bs=BS, lens=[9, 40, 130])
    ex = host_executor(p, max_batch=3, q_lens=[1, 4], validation="full")
    loop = SpecLoop(ex, p, rng)
    lens = np.array([9, 40, 130], np.int32)
    slots = slot_rows(p.block_tables, lens, 4, BS)
    slots[0, 3] = -1
    slots[2, 1] = -1
    loop.step(lens, p.block_tables, 4, slots=slots)
    hs = ex.host_staging()
    assert hs.slot_mapping.shape == (3 * 4,)
    hs.seq_lens[:3] = lens + 1
    hs.block_tables[:3, : p.block_tables.shape[1]] = p.block_tables
    staged_slots = hs.slot_mapping[:12].reshape(3, 4)
    staged_slots[:] = slot_rows(p.block_tables, lens + 1, 4, BS)
    loop.step(hs.seq_lens[:3], hs.block_tables[:3], 4, slots=staged_slots)


def test_plans_results_and_graphs_carry_q_len(rng):
    p = make_problem(rng, dtype="fp32", hq=4, hkv=1, d=64, bs=BS, lens=[30, 600])
    ex = host_executor(p, max_batch=2, max_seq_len=1024, q_lens=[4, 1])
    plans = ex.plans()
    assert sorted({pl.q_len for pl in plans}) == [1, 4] and len(plans) == 2 * len(ex.plans_for(0)) * 2
    assert all(pl.q_len == 1 for pl in ex.plans_for(1)), "without q_len: the smallest"
    assert all(pl.q_len == 4 for pl in ex.plans_for(1, q_len=4))
    assert ex.plan_for(1, 0, q_len=4).q_len == 4 and ex.plan_for(1, 0).q_len == 1
    assert ex.plan_for_batch(2, 1, q_len=4).q_len == 4
    assert [pl.q_len for pl in dg.plan_buckets(ex.config)] == [pl.q_len for pl in plans]
    r = SpecLoop(ex, p, rng).step([30, 600], p.block_tables, 4)
    assert ex.plan_for(r).q_len == 4 and ex.plan_for(r) == ex.plan_for(r.bucket, r.band, q_len=4)
    assert [g.q_len for g in ex.stats().graphs] == [4]
    with pytest.raises(dg.InvalidArgument, match="q_len = 1 is invalid; allowed: None or the step's q_len = 4"):
        ex.plan_for(r, q_len=1)
    assert "q_lens=[1, 4]" in repr(ex)


def test_caller_buffers_of_max_batch_times_max_q_len_rows(rng):
    p = make_problem(rng, dtype="bf16", hq=8, hkv=2, d=64, bs=BS, lens=[5, 70])
    rows = 2 * 4
    q = np.zeros((rows, 8, 64), dg.numpy_dtype("bf16"))
    out = np.zeros((rows, 8 * 64), dg.numpy_dtype("bf16"))  # 2-D rows
    layers = [dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy(), q=q, out=out)]
    ex = dg.Executor(spec=p.spec, layers=layers, max_batch=2, max_seq_len=128, q_lens=[1, 4], backend="host")
    v = ex.query(0, 4)
    assert v.shape == (2, 4, 8, 64) and np.shares_memory(v, q), "the caller's array, reshaped"
    assert ex.query(0) is q and ex.output(0, 4).shape == (2, 4, 8, 64) and np.shares_memory(ex.output(0, 4), out)
    SpecLoop(ex, p, rng).step([5, 70], p.block_tables, 4)
    with pytest.raises(dg.InvalidArgument, match=r"layers\[0\]\.q\.shape\[0\] = 7 is invalid; allowed: at least "
                                                 r"max_batch x max\(q_lens\) = 2 x 4 = 8"):
        dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(p.k_cache, p.v_cache, q=q[:7])], max_batch=2,
                    max_seq_len=128, q_lens=[1, 4], backend="host")


# ------------------------------------------------------------------ bad input

def good_step(ex, p, rng, n=4) -> None:
    """After a rejected call the executor still steps correctly."""
    loop = SpecLoop(ex, p, rng)
    loop.step(p.seq_lens, p.block_tables, n)


@pytest.fixture
def spec_ex(rng):
    p = make_problem(rng, dtype="fp32", hq=4, hkv=2, d=64, bs=BS, lens=[6, 50, 200])
    return host_executor(p, max_batch=3, max_seq_len=256, q_lens=[1, 4]), p


def test_bad_q_len_in_step_views_and_plans(rng, spec_ex):
    ex, p = spec_ex
    slots = slot_rows(p.block_tables, p.seq_lens, 4, BS)
    allowed = r"allowed: one of q_lens = \[1, 4\]"
    for bad in (3, 0, 17, -1):
        with pytest.raises(dg.InvalidArgument, match=rf"^q_len = {bad} is invalid; {allowed}"):
            ex.step(p.seq_lens, p.block_tables, slots, q_len=bad)
        with pytest.raises(dg.InvalidArgument, match=rf"^q_len = {bad} is invalid; {allowed}"):
            ex.query(0, bad)
        with pytest.raises(dg.InvalidArgument, match=rf"q_len = {bad} is invalid; allowed: one of config\.q_lens"):
            ex.plan_for(0, 0, q_len=bad)
    good_step(ex, p, rng)


def test_bad_slot_mapping_width(rng, spec_ex):
    ex, p = spec_ex
    slots = slot_rows(p.block_tables, p.seq_lens, 4, BS)
    for bad in (slots[:, :3].copy(), slots[:, 0].copy(), slots.reshape(-1).copy()):
        with pytest.raises(dg.InvalidArgument,
                           match=r"slot_mapping\.shape = .* is invalid; allowed: \[num_seqs, q_len\] = \[3, 4\]"):
            ex.step(p.seq_lens, p.block_tables, bad, q_len=4)
    with pytest.raises(dg.InvalidArgument, match=r"slot_mapping\.shape = \(3, 4\) is invalid; allowed: \[num_seqs, "
                                                 r"q_len\] = \[3, 1\] or \[num_seqs\]"):
        ex.step(p.seq_lens, p.block_tables, slots)  # q_len 1 with q_len 4's slots
    good_step(ex, p, rng)
    good_step(ex, p, rng, n=1)


def test_seq_len_below_q_len_names_the_sequence(rng, spec_ex):
    ex, p = spec_ex
    lens = np.array([6, 3, 200], np.int32)
    slots = np.full((3, 4), -1, np.int64)
    with pytest.raises(dg.InvalidArgument, match=r"^seq_lens\[1\] = 3 is invalid; allowed: 0 \(a padded row\) or "
                                                 r"q_len\.\.max_seq_len = 4\.\.256"):
        ex.step(lens, p.block_tables, slots, q_len=4)
    assert ex.stats().rejected_steps == 1
    good_step(ex, p, rng)
    q = random_array(rng, (3, 4, 4, 64), "fp32")
    with pytest.raises(dg.InvalidArgument, match=r"seq_lens\[1\] = 3 is invalid; allowed: 0 \(padded row\) or at least "
                                                 r"q_len = 4"):
        dg.paged_attention_v1(np.zeros_like(q), q, p.k_cache, p.v_cache, p.block_tables, lens)


def test_bad_q_lens_config(rng):
    p = make_problem(rng, lens=[4])
    for bad, msg in [
        ([], r"q_lens = \[\] \(empty\) is invalid; allowed: a list of distinct q_lens, each 1\.\.kMaxQLen = 1\.\.16"),
        ([1, 4, 1], r"q_lens = \[1, 4, 1\] is invalid; allowed: distinct values \(1 appears more than once\)"),
        ([1, 17], r"q_lens\[1\] = 17 is invalid; allowed: 1\.\.kMaxQLen = 1\.\.16"),
        ([0], r"q_lens\[0\] = 0 is invalid; allowed: 1\.\.kMaxQLen = 1\.\.16"),
        (4, r"q_lens = 4 is invalid; allowed: a list of ints"),
        ([1, 2.5], r"q_lens\[1\] = 2\.5 is invalid; allowed: an int 1\.\.16"),
    ]:
        with pytest.raises(dg.InvalidArgument, match=msg):
            host_executor(p, q_lens=bad)
    with pytest.raises(dg.InvalidArgument, match=r"q_lens\[1\] = 17"):
        dg.plan_buckets(dg.ExecutorConfig(spec=p.spec, max_batch=2, max_seq_len=64, q_lens=[1, 17]))
    assert host_executor(p, q_lens=np.array([4, 1])).q_lens == [1, 4], "numpy ints are ints"


def test_eager_bad_q_len_and_shapes(rng):
    p = make_problem(rng, dtype="fp32", hq=4, hkv=2, d=64, bs=BS, lens=[20, 40])
    q = random_array(rng, (2, 4, 4, 64), "fp32")
    cache = (p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    out = np.zeros_like(q)
    cases = [
        (dict(q=q, q_len=3), r"^q_len = 3 is invalid; allowed: None or q\.shape\[1\] = 4 \(q is 4-D\)"),
        (dict(q=q, q_len=0), r"^q_len = 0 is invalid; allowed: 1\.\.kMaxQLen = 1\.\.16"),
        (dict(q=random_array(rng, (2, 17, 4, 64), "fp32"), out=np.zeros((2, 17, 4, 64), np.float32)),
         r"^q\.shape\[1\] = 17 is invalid; allowed: a q_len of 1\.\.kMaxQLen = 1\.\.16"),
        (dict(q=q.reshape(8, 4, 64), q_len=3, out=np.zeros((8, 4, 64), np.float32)),
         r"^q\.shape\[0\] = 8 is invalid; allowed: num_seqs x q_len rows, a multiple of q_len = 3"),
        (dict(q=q, out=np.zeros((2, 2, 4, 64), np.float32)), r"^out\.shape = \(2, 2, 4, 64\) is invalid"),
        (dict(q=q, out=np.zeros((6, 4, 64), np.float32)), r"^out\.shape\[0\] = 6 is invalid; allowed: num_seqs x q_len "
                                                          r"= 2 x 4 = 8 rows"),
        (dict(q=np.zeros((2, 5, 4, 64), np.float32)[:, :4]),
         r"^q\.strides\[0\] = 1280 is invalid; allowed: shape\[1\] x strides\[1\] = 1024"),
    ]
    for kw, msg in cases:
        kw.setdefault("out", out)
        with pytest.raises(dg.InvalidArgument, match=msg):
            dg.paged_attention_v1(kw.pop("out"), kw.pop("q"), *cache, **kw)
    with pytest.raises(dg.InvalidArgument, match=r"^workspace\.nbytes = .* is invalid; allowed: at least"):
        dg.paged_attention_v2(out, q, *cache, partition_size=16, max_seq_len=64,
                              workspace=np.zeros(dg.v2_workspace_size(p.spec, 2, 64, 16), np.uint8))
    with pytest.raises(dg.InvalidArgument, match=r"^q_len = 17 is invalid; allowed: 1\.\.kMaxQLen = 1\.\.16"):
        dg.v2_workspace_size(p.spec, 2, 64, 16, q_len=17)
    key = random_array(rng, (2, 4, 2, 64), "fp32")
    with pytest.raises(dg.InvalidArgument, match=r"^slot_mapping\.shape = \(8,\) is invalid; allowed: \[num_seqs, "
                                                 r"q_len\] = \[2, 4\]"):
        dg.append_kv(key, key, p.k_cache, p.v_cache, np.zeros(8, np.int64))
    with pytest.raises(dg.InvalidArgument, match=r"^slot_mapping\.shape = \(3, 2\) is invalid; allowed: \[num_tokens\] "
                                                 r"or \[num_seqs, q_len\] with num_seqs x q_len = num_tokens = 8"):
        dg.append_kv(key.reshape(8, 2, 64), key.reshape(8, 2, 64), p.k_cache, p.v_cache, np.zeros((3, 2), np.int64))
    # The calls after the rejected ones run.
    dg.paged_attention_v1(out, q, *cache)
    check_rows(out, q, *cache, "vllm", "fp32", "after rejected calls")
