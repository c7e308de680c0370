"""Sliding windows, logit soft-caps and attention sinks (issue 17) through the binding, on the host:
eager V1 / V2 and executor steps against the numpy reference, with the blocks before each window
freed (NaN data, invalid table entries), and the bad input."""

from __future__ import annotations

import numpy as np
import pytest

import decodegraph as dg
import reference as ref
from conftest import make_problem, random_array, slots_for


def free_before_window(p, window: int) -> None:
    """NaN in every block wholly before each sequence's window, its table entry -1 (vLLM's freed
    blocks): reading either fails the test."""
    bs = p.spec.block_size
    for i, length in enumerate(p.seq_lens):
        first = int(length) - window if 0 < window < int(length) else 0
        for j in range(first // bs):
            blk = p.block_tables[i, j]
            p.k_cache[blk] = np.nan
            p.v_cache[blk] = np.nan
            p.block_tables[i, j] = -1


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("window", [1, 16, 17, 40])
def test_eager_window_softcap_sinks_match_reference(rng, dtype, window):
    lens = [window - 1 or 1, window, window + 1, 2 * window + 3, 300]
    p = make_problem(rng, dtype=dtype, hq=8, hkv=2, d=64, bs=16, lens=lens, spare_blocks=0)
    free_before_window(p, window)
    sinks = rng.uniform(-1.0, 4.0, size=8).astype(np.float32)
    sinks[3] = -np.inf  # no sink on one head
    want = ref.attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, p.layout, 16,
                         window=window, softcap=5.0, sinks=sinks)
    kw = dict(sliding_window=window, logit_softcap=5.0, sinks=sinks)
    out = dg.paged_attention_v1(p.out(), p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, **kw)
    ref.check_close(out, want, dtype, "v1")
    out = dg.paged_attention_v2(p.out(), p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens,
                                partition_size=16, **kw)
    ref.check_close(out, want, dtype, "v2")


def test_eager_bad_variants_are_named(rng):
    p = make_problem(rng, hq=4, hkv=1, lens=[20])
    args = (p.out(), p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    with pytest.raises(dg.InvalidArgument, match="sliding_window"):
        dg.paged_attention_v1(*args, sliding_window=-1)
    with pytest.raises(dg.InvalidArgument, match="logit_softcap"):
        dg.paged_attention_v1(*args, logit_softcap=float("nan"))
    with pytest.raises(dg.InvalidArgument, match="sinks"):
        dg.paged_attention_v1(*args, sinks=np.zeros(3, np.float32))  # num_q_heads is 4


def test_executor_layers_with_windows_and_sinks(rng):
    bs, d = 16, 64
    lens = np.asarray([5, 40, 200], dtype=np.int32)
    p = make_problem(rng, dtype="fp32", hq=8, hkv=2, d=d, bs=bs, lens=[int(x) + 3 for x in lens])
    local = dg.AttentionSpec(num_q_heads=8, num_kv_heads=2, head_size=d, block_size=bs, dtype="fp32",
                             sliding_window=32, logit_softcap=10.0)
    full = dg.AttentionSpec(num_q_heads=8, num_kv_heads=2, head_size=d, block_size=bs, dtype="fp32")
    sinks = [rng.uniform(-1.0, 4.0, size=8).astype(np.float32) for _ in range(2)]
    layers = [dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy(), sinks=sinks[l]) for l in range(2)]
    ex = dg.Executor(spec=full, layer_specs=[local, full], layers=layers, max_batch=4,
                     max_seq_len=int(p.block_tables.shape[1]) * bs,
                     backend="host")
    assert ex.num_layer_groups == 2
    for grow in range(2):
        n_lens = lens + grow
        slots = slots_for(p.block_tables, n_lens, bs)
        qs = []
        for layer in range(2):
            q = random_array(rng, (3, 8, d), "fp32")
            ex.query(layer)[:3] = q
            ex.new_key(layer)[:3] = random_array(rng, (3, 2, d), "fp32")
            ex.new_value(layer)[:3] = random_array(rng, (3, 2, d), "fp32")
            qs.append(q)
        ex.step(n_lens, p.block_tables, slots)
        for layer, spec in enumerate([local, full]):
            lb = ex.config.layers[layer]
            want = ref.attention(qs[layer], lb.k_cache, lb.v_cache, p.block_tables, n_lens, p.layout, bs,
                                 window=spec.sliding_window, softcap=spec.logit_softcap, sinks=sinks[layer])
            ref.check_close(ex.output(layer)[:3], want, "fp32", f"layer {layer}")


def test_executor_sinks_of_the_wrong_shape_are_named(rng):
    p = make_problem(rng, hq=4, hkv=1, lens=[20])
    bad = dg.LayerBuffers(p.k_cache, p.v_cache, sinks=np.zeros(5, np.float32))
    with pytest.raises(dg.InvalidArgument, match=r"layers\[0\]\.sinks\.shape"):
        dg.Executor(spec=p.spec, layers=[bad], max_batch=1, max_seq_len=64, backend="host")
