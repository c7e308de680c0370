"""Keep-alive rules (docs/python.md): the executor holds what it was given; views hold the executor's
memory; a step body referring back to its executor is collected with it, and nothing leaks at exit."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np

import decodegraph as dg
import reference as ref
from conftest import make_problem, random_array, slots_for


def build(p, **kw):
    """An executor whose arrays exist nowhere else once this returns."""
    layers = [dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy(), out=np.zeros((2, 4, 64), np.float32))]
    return dg.Executor(spec=p.spec, layers=layers, max_batch=2, max_seq_len=64, backend="host", **kw)


def test_executor_outlives_the_arrays_it_was_given(rng):
    p = make_problem(rng, lens=[9, 40])
    k = p.k_cache.copy()
    k_ref = weakref.ref(k)
    count = sys.getrefcount(k)
    ex = dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(k, p.v_cache.copy())], max_batch=2, max_seq_len=64,
                     backend="host")
    del k
    gc.collect()
    assert k_ref() is not None, "the executor holds its K cache"
    ex2 = build(p)  # built in a function: its arrays' only owner is the executor
    gc.collect()
    for e in (ex, ex2):
        q = random_array(rng, (2, 4, 64), "fp32")
        e.query(0)[:2] = q
        e.step(p.seq_lens, p.block_tables, np.full(2, -1, dtype=np.int64))
        lb = e.config.layers[0]
        ref.check_close(e.output(0), ref.attention(q, lb.k_cache, lb.v_cache, p.block_tables, p.seq_lens, "vllm",
                                                   16), "fp32")
    # The executor drops its references when it goes: nothing leaks.
    kept = ex.config.layers[0].k_cache
    assert sys.getrefcount(kept) > count
    del ex, kept
    gc.collect()
    assert k_ref() is None, "the K cache was released with the executor"


def test_views_outlive_the_executor(rng):
    # A view holds the executor's memory (its buffers and the arrays it was given), not the Python
    # executor: the executor is freed as usual, its memory with the last view.
    p = make_problem(rng, lens=[9, 40])
    k = p.k_cache.copy()
    k_ref = weakref.ref(k)
    ex = dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(k, p.v_cache.copy())], max_batch=2, max_seq_len=64,
                     backend="host")
    del k
    core = weakref.ref(ex._core)
    q, nk = ex.query(0), ex.new_key(0)
    staging = ex.host_staging()
    q[:2] = random_array(rng, (2, 4, 64), "fp32")
    ex.step(p.seq_lens, p.block_tables, slots_for(p.block_tables, p.seq_lens, 16))
    snapshot = q.copy()
    del ex
    gc.collect()
    assert core() is None, "the Python executor is freed although views remain"
    assert k_ref() is not None, "a view keeps the executor's memory, and the arrays it holds, alive"
    np.testing.assert_array_equal(q, snapshot)  # still readable ...
    q[:] = 1.0  # ... and writable
    nk[:] = 2.0
    staging.seq_lens[:] = 3
    assert (q == 1.0).all()
    del q, staging
    gc.collect()
    assert k_ref() is not None, "the other view still holds it"
    del nk
    gc.collect()
    assert k_ref() is None, "the last view gone, the executor's memory and its arrays are freed"


def test_view_and_step_body_at_module_level_leak_nothing_at_exit(tmp_path):
    # Issue 36: a script with an executor that has a step body, and a view kept at module level,
    # printed "nanobind: leaked 1 instances ... reference counting issue" at exit: the view held the
    # Python executor, which holds the body, whose globals hold the view; numpy arrays are not seen by
    # the cycle collector, so nothing freed it.
    script = tmp_path / "script.py"
    script.write_text(
        "import numpy as np, decodegraph as dg\n"
        "spec = dg.AttentionSpec(num_q_heads=4, num_kv_heads=1, head_size=64, block_size=16, dtype='fp32')\n"
        "layers = [dg.LayerBuffers(np.zeros(spec.k_cache_shape(8), np.float32),\n"
        "                          np.zeros(spec.v_cache_shape(8), np.float32))]\n"
        "def body(ctx):\n"
        "    ctx.append_kv(0)\n"
        "    ctx.attention(0)\n"
        "    ctx.enqueue_host(lambda: None)\n"
        "ex = dg.Executor(spec=spec, layers=layers, max_batch=2, max_seq_len=64, backend='host', step_body=body)\n"
        "q = ex.query(0)\n"
        "staging = ex.host_staging()\n"
        "ex.step(np.array([3], np.int32), np.arange(4, dtype=np.int32).reshape(1, 4), np.array([2], np.int64))\n"
        "print('stepped')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "stepped"
    assert "leaked" not in run.stderr, run.stderr


def test_rebind_releases_the_old_arrays(rng):
    p = make_problem(rng, lens=[9, 40])
    ex = build(p)
    old = weakref.ref(ex.config.layers[0].k_cache)
    ex.rebind_layers([dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy())])
    gc.collect()
    assert old() is None


def test_step_body_cycle_is_collected(rng):
    p = make_problem(rng, lens=[9, 40])

    class Model:
        ex = None

    m = Model()

    def body(ctx, m=m):
        ctx.enqueue_host(lambda: m.ex.query(0))  # refers back to the executor
        ctx.attention(0)

    m.ex = build(p, step_body=body, append_kv=False)
    m.ex.step(p.seq_lens, p.block_tables)
    core = weakref.ref(m.ex._core)
    model = weakref.ref(m)
    del m, body
    gc.collect()
    assert model() is None and core() is None, "model -> executor -> body -> callback -> model is collected"


def test_threads_share_an_executor(rng):
    # Steps from two threads are serialised; each finds correct results.
    p = make_problem(rng, lens=[9, 40])
    ex = build(p, append_kv=False)
    q = random_array(rng, (2, 4, 64), "fp32")
    ex.query(0)[:2] = q
    lb = ex.config.layers[0]
    want = ref.attention(q, lb.k_cache, lb.v_cache, p.block_tables, p.seq_lens, "vllm", 16)
    errors = []

    def run():
        try:
            for _ in range(20):
                ex.step(p.seq_lens, p.block_tables)
                ex.stats()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert ex.stats().steps == 40
    ref.check_close(ex.output(0), want, "fp32")
