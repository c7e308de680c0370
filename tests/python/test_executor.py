"""Executor steps on the host backend against the float64 numpy reference; zero-copy views; plans,
stats and memory as Python objects; the step body; rebinding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import decodegraph as dg
import reference as ref
from conftest import host_executor, make_problem, random_array, slots_for


class Loop:
    """Drives an executor step by step beside a numpy model of its caches."""

    def __init__(self, ex: dg.Executor, p, rng):
        self.ex, self.p, self.rng = ex, p, rng
        self.model = [(lb.k_cache.copy(), lb.v_cache.copy()) for lb in ex.config.layers]

    def step(self, lens, tables, check=True, **kw):
        p, ex, rng = self.p, self.ex, self.rng
        n = len(lens)
        lens = np.asarray(lens, dtype=np.int32)
        slots = slots_for(tables, lens, p.spec.block_size)
        qs, keys, values = [], [], []
        for layer in range(ex.num_layers):
            q = random_array(rng, (n, p.spec.num_q_heads, p.spec.head_size), p.dtype)
            k = random_array(rng, (n, p.spec.num_kv_heads, p.spec.head_size), p.dtype)
            v = random_array(rng, (n, p.spec.num_kv_heads, p.spec.head_size), p.dtype)
            ex.query(layer)[:n] = q
            ex.new_key(layer)[:n] = k
            ex.new_value(layer)[:n] = v
            qs.append(q), keys.append(k), values.append(v)
        result = ex.step(lens, tables, slots, **kw)
        for layer in range(ex.num_layers):
            kc, vc = self.model[layer]
            ref.append(kc, vc, p.layout, keys[layer], values[layer], slots, p.spec.block_size)
            if check:
                lb = ex.config.layers[layer]
                np.testing.assert_array_equal(lb.k_cache.view(np.uint8), kc.view(np.uint8), "K after append")
                np.testing.assert_array_equal(lb.v_cache.view(np.uint8), vc.view(np.uint8), "V after append")
                want = ref.attention(qs[layer], kc, vc, tables, lens, p.layout, p.spec.block_size)
                ref.check_close(ex.output(layer)[:n], want, p.dtype, f"layer {layer}")
        return result


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("band_select", ["device", "host"])
def test_steps_match_reference(rng, dtype, layout, hq, hkv, band_select):
    bs = 16
    lens = [1, bs - 1, bs, bs + 1, 200, 511, 513]  # batch 7, lengths across the bands 512 / 1024
    p = make_problem(rng, dtype=dtype, layout=layout, hq=hq, hkv=hkv, d=64, bs=bs, lens=[L + 3 for L in lens])
    ex = host_executor(p, layers=2, max_batch=8, max_seq_len=1024, band_select=band_select)
    loop = Loop(ex, p, rng)
    for grow in range(3):  # the same sequences growing by one token per step
        r = loop.step([L + grow for L in lens], p.block_tables)
        assert r.bucket_batch_size == 8
    assert ex.stats().steps == 3


def test_batch17_and_long_lengths_cross_the_threshold(rng):
    # batch 17 (buckets 1, 2, 4, 8, 16, 17), lengths 8191..8193 around the default V1/V2 threshold.
    lens = [8191, 8192, 8193] + list(rng.integers(1, 3000, size=14))
    p = make_problem(rng, dtype="bf16", layout="vllm", hq=4, hkv=1, d=64, bs=16, lens=lens)
    ex = host_executor(p, max_batch=17, max_seq_len=8704)
    loop = Loop(ex, p, rng)
    r = loop.step(lens, p.block_tables)
    assert r.bucket_batch_size == 17
    # A step whose longest sequence is 8193 is above the threshold: its band runs V2.
    plan = ex.plan_for_batch(17, len(ex.plans()) // len(dg.default_batch_buckets(17)) - 1)
    assert plan.band_hi == 8704 and plan.kernel is dg.KernelKind.V2
    r = loop.step([8191, 8192], p.block_tables[:2])  # a smaller bucket, the same caches
    assert r.bucket_batch_size == 2


def test_policies_and_up_front_capture(rng):
    p = make_problem(rng, dtype="fp32", layout="nhd", hq=8, hkv=2, d=64, bs=16, lens=[30, 600, 90])
    for policy in ("auto", "threshold"):
        ex = host_executor(p, max_batch=4, max_seq_len=1024, policy=policy, capture="up_front")
        assert ex.stats().total_captures == ex.stats().distinct_graphs
        Loop(ex, p, rng).step([30, 600, 90], p.block_tables)


def test_config_as_dataclass_or_keywords(rng):
    p = make_problem(rng, lens=[5, 9])
    layers = [dg.LayerBuffers(p.k_cache, p.v_cache)]
    cfg = dg.ExecutorConfig(spec=p.spec, layers=layers, max_batch=2, max_seq_len=64, backend="host",
                            band_edges=[32, 64], batch_buckets=[1, 2])
    a = dg.Executor(cfg)
    b = dg.Executor(spec=p.spec, layers=layers, max_batch=2, max_seq_len=64, backend=dg.BackendKind.HOST,
                    band_edges=[32, 64], batch_buckets=[1, 2])
    c = dg.Executor(cfg, max_batch=1, batch_buckets=[1])  # keywords replace the config's fields
    assert a.plans() == b.plans()
    assert [pl.batch for pl in c.plans()] == [1, 1]
    assert a.backend is dg.BackendKind.HOST and a.num_layers == 1
    assert cfg.max_batch == 2, "the caller's config is not changed"


def test_zero_copy_views(rng):
    p = make_problem(rng, dtype="bf16", layout="vllm", hq=8, hkv=2, d=64, bs=16, lens=[40, 7, 100])
    ex = host_executor(p, max_batch=4, max_seq_len=128)
    spec = p.spec
    q, out, nk, nv = ex.query(0), ex.output(0), ex.new_key(0), ex.new_value(0)
    assert q.shape == (4, 8, 64) and out.shape == (4, 8, 64) and nk.shape == (4, 2, 64) and nv.shape == (4, 2, 64)
    assert q.dtype == dg.numpy_dtype(spec.dtype) and q.flags.writeable
    # Each call views the same memory: no copies.
    assert ex.output(0).ctypes.data == out.ctypes.data and ex.query(0).ctypes.data == q.ctypes.data
    loop = Loop(ex, p, rng)
    loop.step([40, 7, 100], p.block_tables)
    first = out[:3].astype(np.float64)  # `out`, taken before the step, shows its result (checked by Loop)
    assert not np.isnan(first).any()
    # Writing the numpy array exposed as query(0) changes the next step's result, and only that.
    new_q = random_array(rng, (3, 8, 64), "bf16")
    q[:3] = new_q
    lens = np.array([41, 8, 101], dtype=np.int32)
    ex.step(lens, p.block_tables, slots_for(p.block_tables, lens, 16))
    want = ref.attention(new_q, ex.config.layers[0].k_cache, ex.config.layers[0].v_cache, p.block_tables, lens,
                         p.layout, 16)
    ref.check_close(out[:3], want, "bf16", "after writing query(0)")
    assert not np.array_equal(out[:3].astype(np.float64), first)


def test_caller_buffers_fused_qkv(rng):
    # q / new K / new V as strided slices of one fused buffer per layer, out a caller array:
    # query(l) & co. then return the caller's arrays.
    p = make_problem(rng, dtype="fp16", layout="nhd", hq=4, hkv=2, d=64, bs=16, lens=[12, 50])
    row = (4 + 2 * 2) * 64
    qkv = np.zeros((2, row), dtype=np.float16)
    out = np.zeros((2, 4, 64), dtype=np.float16)
    q, k, v = qkv[:, :256], qkv[:, 256:384], qkv[:, 384:]
    layers = [dg.LayerBuffers(p.k_cache, p.v_cache, q=q, out=out, new_key=k, new_value=v)]
    ex = dg.Executor(spec=p.spec, layers=layers, max_batch=2, max_seq_len=64, backend="host")
    assert ex.query(0) is q and ex.output(0) is out and ex.new_key(0) is k
    qkv[:] = random_array(rng, qkv.shape, "fp16")
    kc, vc = p.k_cache.copy(), p.v_cache.copy()
    lens = p.seq_lens
    slots = slots_for(p.block_tables, lens, 16)
    ex.step(lens, p.block_tables, slots)
    ref.append(kc, vc, "nhd", k.reshape(2, 2, 64), v.reshape(2, 2, 64), slots, 16)
    ref.check_close(out, ref.attention(q.reshape(2, 4, 64), kc, vc, p.block_tables, lens, "nhd", 16), "fp16")


def test_host_staging_skips_the_copy(rng):
    p = make_problem(rng, dtype="fp32", lens=[20, 33, 5])
    ex = host_executor(p, max_batch=4, max_seq_len=64)
    hs = ex.host_staging()
    assert hs.seq_lens.dtype == np.int32 and hs.slot_mapping.dtype == np.int64
    assert hs.block_tables.shape == (4, hs.block_table_stride)
    lens = p.seq_lens
    hs.seq_lens[:3] = lens
    w = p.block_tables.shape[1]
    hs.block_tables[:3, :w] = p.block_tables
    hs.slot_mapping[:3] = slots_for(p.block_tables, lens, 16)
    ex.query(0)[:3] = p.q
    before = ex.stats().staging_copy_bytes
    ex.step(hs.seq_lens[:3], hs.block_tables[:3], hs.slot_mapping[:3])
    assert ex.stats().staging_copy_bytes == before, "inputs already in the staging buffers are not copied"
    ex.step(lens, p.block_tables, slots_for(p.block_tables, lens, 16))
    assert ex.stats().staging_copy_bytes > before


def test_plans_stats_memory_are_plain_objects(rng):
    p = make_problem(rng, lens=[3, 700])
    ex = host_executor(p, max_batch=2, max_seq_len=1024, band_select="host")
    plans = ex.plans()
    buckets = dg.default_batch_buckets(2)
    bands = dg.default_band_edges(1024, 8192)
    assert len(plans) == len(buckets) * len(bands)
    assert all(isinstance(x, dg.BucketPlan) for x in plans)
    pl = plans[0]
    assert dataclasses.asdict(pl)["band_hi"] == bands[0] and isinstance(pl.reason, dg.PlanReason)
    assert pl.reason_text and isinstance(pl.grid, tuple) and len(pl.grid) == 3
    assert "batch" in ex.plan_table() and str(bands[-1]) in ex.plan_table()
    assert dg.plan_buckets(dataclasses.replace(ex.config, layers=[])) == plans
    r = Loop(ex, p, rng).step([3, 700], p.block_tables)
    assert ex.plan_for(r) == ex.plan_for(r.bucket, r.band) == ex.plan_for_batch(2, r.band)
    assert ex.plan_for(r).band_hi == 1024 and r.band == 1
    s = ex.stats()
    assert isinstance(s, dg.ExecutorStats) and s.steps == 1 and s.total_captures == 1
    assert s.graphs[0].replays == 1 and s.replays(r.kernel) == 1 and s.band_select is dg.BandSelect.HOST
    m = ex.memory()
    assert isinstance(m, dg.MemoryReport) and m.total == m.static_buffers + m.workspace + m.graphs > 0


def test_plan_for_a_band_chosen_on_the_device_and_the_graph_ids(rng):
    # kDevice (the default): graph_id names the bucket's graph, launch_id the band's launch; a result
    # whose band the graph chose on the device (band -1, what device tensors give on CUDA) has no
    # single plan: plan_for says where to look, plans_for(bucket) has every band's.
    p = make_problem(rng, lens=[3, 700])
    ex = host_executor(p, max_batch=2, max_seq_len=1024)
    assert ex.band_select is dg.BandSelect.DEVICE
    r = Loop(ex, p, rng).step([3, 700], p.block_tables)
    assert r.graph_id == r.bucket and r.launch_id == ex.plan_for(r).graph_id and r.band == 1
    g = ex.stats().graphs[0]
    assert g.graph_id == r.graph_id and g.band_launch_ids[r.band] == r.launch_id
    assert [x.graph_id for x in ex.plans_for(r.bucket)] == g.band_launch_ids
    on_device = dataclasses.replace(r, band=-1, band_hi=0, launch_id=-1, band_on_device=True)
    with pytest.raises(dg.InvalidArgument, match=r"step.band = -1 .*plans_for\(step.bucket\).*band_replays"):
        ex.plan_for(on_device)
    assert ex.plans_for(r.bucket)[1] == ex.plan_for(r)


def test_step_body_host_callbacks(rng):
    # A whole step captured through the body: host work between the layers runs at every replay.
    p = make_problem(rng, dtype="fp32", layout="vllm", hq=4, hkv=1, d=64, bs=16, lens=[9, 30])
    calls = []
    holder = []

    def layer1_q_from_layer0_out() -> None:
        # Layer 1's q is layer 0's output, copied at replay time: a dependency only a body expresses.
        ex = holder[0]
        ex.query(1)[:] = ex.output(0)
        calls.append("copy")

    def body(ctx: dg.StepContext) -> None:
        assert ctx.backend is dg.BackendKind.HOST and ctx.plan.batch >= 1
        ctx.enqueue_host(lambda: calls.append("start"))
        ctx.attention(0)
        ctx.enqueue_host(layer1_q_from_layer0_out)
        ctx.attention(1)

    ex = host_executor(p, layers=2, max_batch=2, max_seq_len=64, step_body=body, append_kv=False)
    holder.append(ex)
    lens = p.seq_lens
    ex.query(0)[:2] = p.q
    for _ in range(2):
        ex.step(lens, p.block_tables)
        layers = ex.config.layers
        out0 = ref.attention(p.q, layers[0].k_cache, layers[0].v_cache, p.block_tables, lens, "vllm", 16)
        ref.check_close(ex.output(0)[:2], out0, "fp32", "layer 0")
        out1 = ref.attention(ex.output(0)[:2], layers[1].k_cache, layers[1].v_cache, p.block_tables, lens, "vllm", 16)
        ref.check_close(ex.output(1)[:2], out1, "fp32", "layer 1 over layer 0's output")
    assert calls == ["start", "copy"] * 2


def test_step_body_exception_propagates_and_executor_stays_usable(rng):
    p = make_problem(rng, lens=[9, 30])
    fail = [True]

    def boom() -> None:
        if fail[0]:
            raise KeyError("from a host callback")

    def body(ctx):
        ctx.enqueue_host(boom)
        ctx.append_kv(0)
        ctx.attention(0)

    ex = host_executor(p, max_batch=2, max_seq_len=64, step_body=body)
    lens = p.seq_lens
    with pytest.raises(KeyError, match="from a host callback"):
        ex.step(lens, p.block_tables, slots_for(p.block_tables, lens, 16))
    fail[0] = False
    ex.query(0)[:2] = p.q
    ex.step(lens, p.block_tables, np.full(2, -1, dtype=np.int64))  # no append: attend over the cache as is
    ref.check_close(ex.output(0)[:2], ref.attention(p.q, ex.config.layers[0].k_cache, ex.config.layers[0].v_cache,
                                                    p.block_tables, lens, "vllm", 16), "fp32")


def test_rebind_layers(rng):
    p = make_problem(rng, dtype="fp16", layout="nhd", lens=[20, 40])
    ex = host_executor(p, max_batch=2, max_seq_len=64)
    loop = Loop(ex, p, rng)
    loop.step([20, 40], p.block_tables)
    new = [dg.LayerBuffers(random_array(rng, p.k_cache.shape, "fp16"), random_array(rng, p.v_cache.shape, "fp16"))]
    ex.rebind_layers(new)
    assert ex.config.layers[0].k_cache is new[0].k_cache and ex.stats().rebinds == 1
    loop.model = [(new[0].k_cache.copy(), new[0].v_cache.copy())]
    loop.step([21, 41], p.block_tables)  # against the new caches
