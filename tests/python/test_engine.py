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


# ---------------------------------------------------------------- padded rows


@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("validation", ["cheap", "full"])
def test_padded_rows_in_a_step(rng, q_len, validation):
    # Before: step() rejected seq_len 0 ("seq_lens[1] = 0 is invalid") while the eager calls took it.
    p = make_problem(rng, dtype="fp32", hq=4, hkv=2, d=64, lens=[40, 0, 300, 0, 9], spare_blocks=4)
    ex = dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy())], max_batch=8,
                     max_seq_len=512, q_lens=[1, 4], validation=validation, backend="host")
    live = p.seq_lens > 0
    pos = p.seq_lens[:, None] - q_len + np.arange(q_len)
    slots = np.where(live[:, None], p.block_tables[np.arange(5)[:, None], np.maximum(pos, 0) // BS] * BS +
                     np.maximum(pos, 0) % BS, -1).astype(np.int64)
    ex.query(0, q_len=q_len)[:5] = random_array(rng, (5, q_len, 4, 64), "fp32")
    new_k = random_array(rng, (5, q_len, 2, 64), "fp32")
    new_k[~live] = np.nan  # a padded row appended would leave NaN in the cache
    ex.new_key(0, q_len=q_len)[:5] = new_k
    ex.new_value(0, q_len=q_len)[:5] = new_k
    ex.output(0)[:] = np.nan
    r = ex.step(p.seq_lens, p.block_tables, slots, q_len=q_len)
    assert r.bucket_batch_size == 8
    lb = ex.config.layers[0]
    out = np.asarray(ex.output(0, q_len=q_len))[:5].astype(np.float64)
    assert np.isnan(out[~live]).all(), "a padded row's output was written"
    assert not np.isnan(lb.k_cache).any() and not np.isnan(lb.v_cache).any(), "a padded row was appended"
    want = ref.attention_rows(np.asarray(ex.query(0, q_len=q_len))[:5], lb.k_cache, lb.v_cache, p.block_tables,
                              p.seq_lens, "vllm", BS)
    ref.check_close(out[live], want[live], "fp32")
    # A padded row whose slot is not negative would append: refused, naming it.
    slots[3, 0] = 5
    with pytest.raises(dg.InvalidArgument, match=rf"^slot_mapping\[{3 * q_len}\] = 5 is invalid; allowed: negative: "
                                                 r"seq_lens\[3\] = 0 marks a padded row"):
        ex.step(p.seq_lens, p.block_tables, slots, q_len=q_len)


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


def rejections(ex, p):
    """13 refused steps, each a different mistake: 8 the binding's own checks, 5 the library's."""
    lens, tables, slots = p.seq_lens, p.block_tables, slots_for(p.block_tables, p.seq_lens, BS)
    wide = np.repeat(tables, 2, axis=1)
    return [
        lambda: ex.step(lens.astype(np.int64), tables, slots),            # seq_lens.dtype
        lambda: ex.step(lens[None, :], tables, slots),                    # seq_lens.shape
        lambda: ex.step(lens, wide[:, ::2], slots),                       # block_tables.strides
        lambda: ex.step(lens, tables, slots[:1]),                         # slot_mapping.shape
        lambda: ex.step(lens, tables, slots, q_len=3),                    # q_len
        lambda: ex.step(lens, tables),                                    # slot_mapping None
        lambda: ex.step(None, tables, slots),                             # seq_lens None
        lambda: ex.step(lens, tables.astype(np.float32), slots),          # block_tables.dtype
        lambda: ex.step(np.full_like(lens, 9999), tables, slots),         # seq_lens[0] too long
        lambda: ex.step(np.ones(9, np.int32), np.zeros((9, 4), np.int32), np.zeros(9, np.int64)),  # num_seqs
        lambda: ex.step(lens, tables, slots, max_seq_len=2),              # the hint below a length
        lambda: ex.step(-lens, tables, slots),                            # a negative length
        lambda: ex.step(lens, np.ascontiguousarray(tables[:, :1]), slots),  # table too narrow
    ]


def test_rejected_steps_count_the_bindings_own_checks(rng):
    # Before: 5 of these 13 were counted, the binding's dtype / shape / None / q_len checks not.
    p = make_problem(rng, dtype="fp32", lens=[20, 33, 5])
    ex = dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy())], max_batch=4,
                     max_seq_len=64, q_lens=[1, 4], backend="host")
    ex.step(p.seq_lens, p.block_tables, slots_for(p.block_tables, p.seq_lens, BS))
    messages = []
    for bad in rejections(ex, p):
        with pytest.raises(dg.InvalidArgument) as e:
            bad()
        messages.append(str(e.value))
    st = ex.stats()
    assert (st.steps, st.rejected_steps) == (1, 13)
    # Python's words: the names the caller passed, None for a missing array, no C++ spellings.
    for m in messages:
        for cxx in ("inputs.", "null", "config()", "::k", "kMaxQLen"):
            assert cxx not in m, f"{cxx!r} in {m!r}"
    assert messages[0].startswith("seq_lens.dtype = int64 is invalid; allowed: int32")
    assert messages[5].startswith("slot_mapping = None is invalid; allowed: int64 [num_seqs]")
    assert messages[6].startswith("seq_lens = None is invalid")
    assert messages[8].startswith("seq_lens[0] = 9999 is invalid"), "one name for one argument"
    assert messages[12].startswith("block_tables.shape[1] (the block-table stride) = 1 is invalid")


# ---------------------------------------------------------------- errors that name the layer


def fp8_layers(rng, spec, n, scales=None, sinks=None):
    layers = []
    for i in range(n):
        k = np.zeros(spec.k_cache_shape(16), ml_dtypes.float8_e4m3fn)
        v = np.zeros(spec.v_cache_shape(16), ml_dtypes.float8_e4m3fn)
        ks, vs = (scales or {}).get(i, (1.0, 1.0))
        layers.append(dg.LayerBuffers(k, v, k_scale=np.array([ks], np.float32), v_scale=np.array([vs], np.float32),
                                      sinks=(sinks or {}).get(i)))
    return layers


def test_fp8_layer_without_a_scale_reads_as_python():
    # Before: "layers[0].k_scale = null is invalid; allowed: a pointer to 1 fp32 value(s) ...".
    spec = dg.AttentionSpec(num_q_heads=4, num_kv_heads=2, head_size=64, dtype="bf16", kv_cache_dtype="fp8")
    layers = fp8_layers(None, spec, 2)
    layers[1].k_scale = None
    with pytest.raises(dg.InvalidArgument, match=r"^layers\[1\]\.k_scale = None is invalid; allowed: float32 \[1\] "
                                                 r"\(spec\.kv_scale_count: one for the layer\), required with "
                                                 r"kv_cache_dtype fp8_e4m3$"):
        dg.Executor(spec=spec, layers=layers, max_batch=2, max_seq_len=64, backend="host")


def test_bad_scales_and_sinks_name_the_layer_and_run_nothing(rng):
    # Before: a negative k_scale and a +inf sink passed construction; a NaN scale failed the step
    # midway with "v_scale[0] = nan is invalid", no layer named.
    spec = dg.AttentionSpec(num_q_heads=4, num_kv_heads=2, head_size=64, block_size=BS, dtype="bf16",
                            kv_cache_dtype="fp8")
    with pytest.raises(dg.InvalidArgument, match=r"^layers\[1\]\.k_scale\[0\] = -1 is invalid; allowed: a finite value > 0"):
        dg.Executor(spec=spec, layers=fp8_layers(rng, spec, 3, scales={1: (-1.0, 1.0)}), max_batch=2, max_seq_len=64,
                    backend="host")
    sinks = np.zeros(4, np.float32)
    sinks[2] = np.inf
    with pytest.raises(dg.InvalidArgument, match=r"^layers\[0\]\.sinks\[2\] = inf is invalid"):
        dg.Executor(spec=spec, layers=fp8_layers(rng, spec, 3, sinks={0: sinks}), max_batch=2, max_seq_len=64,
                    backend="host")
    layers = fp8_layers(rng, spec, 3)
    ex = dg.Executor(spec=spec, layers=layers, max_batch=2, max_seq_len=64, backend="host")
    lens, tables = np.array([5, 9], np.int32), np.arange(8, dtype=np.int32).reshape(2, 4)
    slots = slots_for(tables, lens, BS)
    for layer in range(3):
        ex.new_key(layer)[:2] = 0.5
        ex.new_value(layer)[:2] = 0.5
    ex.step(lens, tables, slots)
    before = [np.array(lb.k_cache.view(np.uint8)) for lb in layers]
    layers[2].v_scale[0] = np.nan  # written between two steps
    for layer in range(3):
        ex.new_key(layer)[:2] = 0.25
    with pytest.raises(dg.InvalidArgument, match=r"^layers\[2\]\.v_scale\[0\] = nan is invalid"):
        ex.step(lens + 1, tables, slots + 1)
    for layer, lb in enumerate(layers):
        np.testing.assert_array_equal(lb.k_cache.view(np.uint8), before[layer], err_msg=f"layer {layer} appended")
    assert ex.stats().rejected_steps == 1
    layers[2].v_scale[0] = 1.0
    ex.step(lens + 1, tables, slots + 1)


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


def test_host_staging_is_cheap_to_reuse_and_stays_valid(rng):
    # Before: every call built new views (~5 us) documented as valid until the next step.
    p = make_problem(rng, dtype="fp32", lens=[20, 33, 5])
    ex = dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy())], max_batch=4,
                     max_seq_len=64, backend="host")
    hs = ex.host_staging()
    address = hs.block_tables.ctypes.data
    n, w = 3, p.block_tables.shape[1]
    for step in range(4):
        assert ex.host_staging() is hs, "the same set, its views made once"
        lens = p.seq_lens + step
        hs.seq_lens[:n] = lens
        hs.block_tables[:n, :w] = p.block_tables
        hs.slot_mapping[:n] = slots_for(p.block_tables, lens, BS)
        before = ex.stats().staging_copy_bytes
        ex.step(hs.seq_lens[:n], hs.block_tables[:n], hs.slot_mapping[:n])
        assert ex.stats().staging_copy_bytes == before, "staged in place: no copy"
    assert hs.block_tables.ctypes.data == address


def test_step_fast_path_takes_any_buffer_and_falls_back_for_errors(rng):
    # Host inputs through the buffer protocol (numpy, memoryview, array.array) skip nanobind's
    # import; anything it does not accept goes the general way and gets the general message.
    p = make_problem(rng, dtype="fp32", lens=[20, 33, 5])
    ex = dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy())], max_batch=4,
                     max_seq_len=64, backend="host", append_kv=False)
    ex.query(0)[:3] = p.q
    outs = []
    tables = p.block_tables
    for lens in (p.seq_lens, memoryview(p.seq_lens), array.array("i", p.seq_lens.tolist())):
        ex.output(0)[:] = 0
        ex.step(lens, memoryview(tables) if isinstance(lens, memoryview) else tables)
        outs.append(np.array(ex.output(0)[:3]))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    ref.check_close(outs[0], ref.attention(p.q, p.k_cache, p.v_cache, tables, p.seq_lens, "vllm", BS), "fp32")
    wide = np.repeat(p.seq_lens, 2)
    with pytest.raises(dg.InvalidArgument, match=r"^seq_lens\.strides = \(2,\) elements is invalid"):
        ex.step(wide[::2], tables)
    with pytest.raises(dg.InvalidArgument, match=r"^seq_lens\.dtype = bfloat16 is invalid; allowed: int32"):
        ex.step(p.seq_lens.astype(ml_dtypes.bfloat16), tables)
    with pytest.raises(dg.InvalidArgument, match=r"^seq_lens\.dtype = int16 is invalid; allowed: int32"):
        ex.step(array.array("h", [20, 33, 5]), tables)
    with pytest.raises(dg.InvalidArgument, match=r"^block_tables\.shape = \(2, 3\) is invalid"):
        ex.step(p.seq_lens, tables[:2])
    assert ex.stats().rejected_steps == 4


def test_signatures_name_array_types_not_any():
    # Before: every array parameter of the stubs and wrappers was typed Any.
    hints = typing.get_type_hints(dg.paged_attention_v1)
    assert hints["q"] is dg.ArrayLike and hints["stream"] == dg.StreamLike
    assert typing.get_type_hints(dg.append_kv)["slot_mapping"] is dg.ArrayLike
    assert typing.get_type_hints(dg.Executor.step)["seq_lens"] is dg.ArrayLike
    assert typing.get_type_hints(dg.Executor.query)["return"] is dg.ArrayView
    assert typing.get_type_hints(dg.LayerBuffers)["k_cache"] is dg.ArrayLike
    assert typing.get_type_hints(dg.HostStaging)["seq_lens"] != typing.Any
