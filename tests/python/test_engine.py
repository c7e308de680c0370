"""The package as an engine uses it (issue 36): vLLM's names, padded rows, statistics over every
layer group, every refused step counted, errors in Python's words naming the layer, short reprs,
reusable host-staging views, the step's fast path for buffer-protocol inputs, typed signatures.
Each test here failed before the change it is named after."""

from __future__ import annotations

import array
import dataclasses
import typing

import ml_dtypes
import numpy as np
import pytest

import decodegraph as dg
import reference as ref
from conftest import make_problem, random_array, slots_for

BS = 16


# ---------------------------------------------------------------- vLLM's names


def test_attention_spec_takes_vllms_kv_cache_dtype():
    # Before: AttentionSpec(kv_cache_dtype="fp8") raised TypeError (the field was kv_dtype only).
    s = dg.AttentionSpec(num_q_heads=8, num_kv_heads=2, head_size=64, dtype="bf16", kv_cache_dtype="fp8")
    assert s.kv_cache_dtype is dg.KVCacheDType.FP8_E4M3 and s.kv_dtype is s.kv_cache_dtype
    assert dg.AttentionSpec(kv_dtype="fp8_e5m2").kv_cache_dtype is dg.KVCacheDType.FP8_E5M2  # the alias
    assert dg.AttentionSpec(kv_cache_dtype="fp8", kv_dtype="fp8_e4m3").kv_cache_dtype is dg.KVCacheDType.FP8_E4M3
    with pytest.raises(dg.InvalidArgument, match="kv_dtype = 'fp8_e5m2' is invalid; allowed: kv_cache_dtype's value"):
        dg.AttentionSpec(kv_cache_dtype="fp8", kv_dtype="fp8_e5m2")
    with pytest.raises(dg.InvalidArgument, match="spec.kv_cache_dtype = 'fp9'"):
        dg.AttentionSpec(kv_cache_dtype="fp9")
    assert "kv_cache_dtype" in {f.name for f in dataclasses.fields(s)}
    assert dataclasses.replace(s, kv_cache_dtype="auto").kv_cache_dtype is dg.KVCacheDType.AUTO
    assert "kv_cache_dtype=KVCacheDType.FP8_E4M3" in repr(s)
    # Positionally too, where kv_dtype was: the eighth field.
    assert dg.AttentionSpec(8, 2, 64, 16, "bf16", "nhd", 0.0, "fp8").kv_cache_dtype is dg.KVCacheDType.FP8_E4M3
    # The executor reads it (a cache of fp8 codes is accepted).
    layers = [dg.LayerBuffers(np.zeros(s.k_cache_shape(8), ml_dtypes.float8_e4m3fn),
                              np.zeros(s.v_cache_shape(8), ml_dtypes.float8_e4m3fn),
                              k_scale=np.ones(1, np.float32), v_scale=np.ones(1, np.float32))]
    ex = dg.Executor(spec=s, layers=layers, max_batch=2, max_seq_len=64, backend="host")
    assert ex.spec.kv_cache_dtype is dg.KVCacheDType.FP8_E4M3


# ---------------------------------------------------------------- statistics


def two_group_executor(rng):
    """Layers 0, 2 windowed (V1 in every band), 1, 3 full (V2 above the threshold, 256)."""
    p = make_problem(rng, dtype="fp32", hq=4, hkv=2, d=64, lens=[700, 600, 513])
    local = dataclasses.replace(p.spec, sliding_window=32)
    specs = [local, p.spec, local, p.spec]
    layers = [dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy()) for _ in specs]
    ex = dg.Executor(spec=p.spec, layer_specs=specs, layers=layers, max_batch=4, max_seq_len=1024,
                     v2_threshold=256, policy="threshold", backend="host", append_kv=False)
    return ex, p


@pytest.mark.parametrize("band_select", ["host", "device"])
def test_stats_count_every_layer_groups_replays(rng, band_select):
    # Before: replays_v1 / replays_v2 counted layer group 0's launches only (5 / 0 here).
    ex, p = two_group_executor(rng)
    ex = dg.Executor(dataclasses.replace(ex.config, band_select=band_select))
    for _ in range(5):
        r = ex.step(p.seq_lens, p.block_tables)
    assert ex.plan_for(r, group=0).kernel is dg.KernelKind.V1 and ex.plan_for(r, group=1).kernel is dg.KernelKind.V2
    st = ex.stats()
    assert (st.replays_v1, st.replays_v2) == (5, 5), "every group's launches"
    assert st.group_replays == [(5, 0), (0, 5)]
    assert st.replays("v2") == 5 and st.replays("v2", 0) == 0 and st.replays("v2", 1) == 5
    assert st.replays_v1 + st.replays_v2 == st.steps * ex.num_layer_groups


# ---------------------------------------------------------------- small things


def test_reprs_are_short(rng):
    # Before: repr(LayerBuffers) printed the arrays (58 KB), repr(config) 2,171 lines.
    spec = dg.AttentionSpec(num_q_heads=32, num_kv_heads=8, head_size=128, dtype="bf16")
    bf16 = dg.numpy_dtype("bf16")
    lb = dg.LayerBuffers(np.zeros(spec.k_cache_shape(64), bf16), np.zeros(spec.v_cache_shape(64), bf16),
                         sinks=np.zeros(32, np.float32))
    text = repr(lb)
    assert text == ("LayerBuffers(k_cache=ndarray(bfloat16, (64, 8, 16, 16, 8)), v_cache=ndarray(bfloat16, "
                    "(64, 8, 128, 16)), sinks=ndarray(float32, (32,)))")
    windowed = dataclasses.replace(spec, sliding_window=128)
    cfg = dg.ExecutorConfig(spec=spec, layers=[lb] * 24, layer_specs=[windowed, spec] * 12,
                            alibi_slopes=[0.5] * 32, max_batch=64)
    text = repr(cfg)
    assert "\n" not in text and len(text) < 2000, text
    assert "layers=[24 x LayerBuffers(k_cache=ndarray(bfloat16, (64, 8, 16, 16, 8))" in text
    assert "alibi_slopes=<32 floats>" in text and "max_batch=64" in text
    assert "layer_specs=[24 AttentionSpec: AttentionSpec(" in text  # 24 alternating: the count and the first


