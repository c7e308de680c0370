"""Every C++ error kind surfaces as its Python exception with its message; bad arrays get an error
naming the argument, and the executor stays usable."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import decodegraph as dg
import reference as ref
from conftest import host_executor, make_problem, random_array, slots_for


class FakeCudaArray:
    """An object exposing __cuda_array_interface__ (device memory that is never touched here)."""

    def __init__(self, shape, typestr="<i4"):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (0x7F0000000000, False), "version": 3, "strides": None}


class RefusesExport:
    """An array whose producer refuses the DLPack export (as torch does for a tensor requiring grad)."""

    def __dlpack__(self, **kwargs):
        raise BufferError("cannot export: requires grad")

    def __dlpack_device__(self):
        return (1, 0)


def good_step(ex, p, rng):
    """A correct step after a rejected one: it runs and matches the reference."""
    n = p.n
    q = random_array(rng, (n, p.spec.num_q_heads, p.spec.head_size), p.dtype)
    ex.query(0)[:n] = q
    ex.step(p.seq_lens, p.block_tables, np.full(n, -1, dtype=np.int64))  # -1: no append
    lb = ex.config.layers[0]
    want = ref.attention(q, lb.k_cache, lb.v_cache, p.block_tables, p.seq_lens, p.layout, p.spec.block_size)
    ref.check_close(ex.output(0)[:n], want, p.dtype, "after a rejected call")


# ------------------------------------------------------------------ the kinds

def test_hierarchy():
    assert issubclass(dg.InvalidArgument, dg.Error) and issubclass(dg.InvalidArgument, ValueError)
    assert issubclass(dg.CorruptedStepReport, dg.InvalidArgument)
    assert issubclass(dg.OutOfMemory, dg.Error) and issubclass(dg.OutOfMemory, MemoryError)
    assert issubclass(dg.CudaError, dg.Error) and issubclass(dg.Error, RuntimeError)
    e = dg.CudaError("x", 700, True)
    assert (e.code, e.context_lost, str(e)) == (700, True, "x")


def test_invalid_argument_from_config(rng):
    p = make_problem(rng, lens=[4])
    spec = dg.AttentionSpec(num_q_heads=4, num_kv_heads=1, head_size=100, block_size=16, dtype="fp32")
    with pytest.raises(dg.InvalidArgument) as e:
        dg.Executor(spec=spec, layers=[dg.LayerBuffers(p.k_cache, p.v_cache)], backend="host")
    assert "head_size = 100 is invalid; allowed: 64, 80, 96, 112, 128, 192, 256" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(dg.InvalidArgument, match="max_batch"):
        host_executor(p, max_batch=0)
    with pytest.raises(dg.InvalidArgument, match="policy = 'fastest' is invalid; allowed: auto, threshold, measured"):
        host_executor(p, policy="fastest")
    with pytest.raises(dg.InvalidArgument, match="log_level"):
        host_executor(p, log_level="loud")


def test_invalid_argument_from_step_leaves_executor_usable(rng):
    p = make_problem(rng, dtype="fp16", lens=[10, 20])
    ex = host_executor(p, max_batch=2, max_seq_len=32)
    too_long = np.array([10, 33], dtype=np.int32)
    with pytest.raises(dg.InvalidArgument, match=r"seq_lens\[1\] = 33 is invalid"):
        ex.step(too_long, p.block_tables, slots_for(p.block_tables, p.seq_lens, 16))
    with pytest.raises(dg.InvalidArgument, match="num_seqs = 3"):
        ex.step(np.array([1, 2, 3], dtype=np.int32), np.zeros((3, 2), dtype=np.int32), np.zeros(3, dtype=np.int64))
    assert ex.stats().rejected_steps >= 1
    good_step(ex, p, rng)


def test_bad_block_id_under_cheap_validation_is_reported_next(rng):
    p = make_problem(rng, lens=[10, 20])
    ex = host_executor(p, max_batch=2, max_seq_len=32, validation="cheap")
    tables = p.block_tables.copy()
    tables[1, 1] = p.num_blocks + 5
    ex.step(p.seq_lens, tables, np.full(2, -1, dtype=np.int64))  # cheap: ids are not read on the host
    with pytest.raises(dg.CorruptedStepReport, match=r"block_tables\[1\]\[1\]") as e:
        ex.check_errors()
    assert isinstance(e.value, dg.InvalidArgument)  # still caught by an InvalidArgument handler
    assert (e.value.kind, e.value.sequence, e.value.block_table_column) == ("bad_block_id", 1, 1)
    assert (e.value.first_step, e.value.last_step, e.value.step_refused) == (1, 1, False)
    ex.check_errors()  # reported once
    good_step(ex, p, rng)


def test_wrong_slot_under_cheap_validation_is_a_corrupted_step_report(rng):
    # The slot of position seq_len instead of seq_len - 1 for sequence 0: kCheap runs the step, the
    # append skips that slot, and the next step() raises, runs nothing, and names the sequence.
    p = make_problem(rng, lens=[10, 20], width=3)
    ex = host_executor(p, max_batch=2, max_seq_len=48, validation="cheap")
    assert dg.CorruptedStepReport.__module__ == "decodegraph"
    slots = slots_for(p.block_tables, p.seq_lens, 16)
    slots[0] += 1  # position 10 = seq_len
    ex.query(0)[:2] = random_array(rng, (2, p.spec.num_q_heads, p.spec.head_size), p.dtype)
    ex.step(p.seq_lens, p.block_tables, slots)
    with pytest.raises(dg.CorruptedStepReport) as e:
        ex.step(p.seq_lens, p.block_tables, slots_for(p.block_tables, p.seq_lens, 16))
    r = e.value
    assert (r.kind, r.sequence, r.block_table_column, r.step_refused) == ("slot_mismatch", 0, -1, True)
    assert r.first_step <= 1 == r.last_step
    for part in ("slot_mapping[0]", "Re-prefill sequence 0", "submit its inputs again", 'validation="cheap"'):
        assert part in str(r)
    assert "inputs." not in str(r) and "ValidationLevel::" not in str(r), "C++ names in a Python message"
    assert ex.stats().rejected_steps == 1 and ex.stats().bad_block_reports == 1
    again = pickle.loads(pickle.dumps(r))
    assert (type(again), again.kind, again.sequence, str(again)) == (dg.CorruptedStepReport, r.kind, 0, str(r))
    good_step(ex, p, rng)


def test_out_of_memory_from_an_allocation(rng):
    p = make_problem(rng, lens=[10])
    with dg.fault.inject(dg.fault.Site.ALLOC):
        with pytest.raises(dg.OutOfMemory) as e:
            host_executor(p)
        assert dg.fault.fired(dg.fault.Site.ALLOC) == 1
    assert isinstance(e.value, MemoryError) and "injected" in str(e.value)
    host_executor(p)  # nothing half-built was kept: a new one builds


def test_memory_budget_too_small_is_invalid_argument(rng):
    # A budget below the static buffers is the caller's configuration, not a failed allocation.
    p = make_problem(rng, lens=[10])
    with pytest.raises(dg.InvalidArgument, match="memory_budget_bytes = 64 is invalid"):
        host_executor(p, memory_budget_bytes=64)


def test_cuda_error_with_code_and_context(rng):
    p = make_problem(rng, lens=[10, 20])
    ex = host_executor(p, max_batch=2, max_seq_len=32)
    with dg.fault.inject(dg.fault.Site.GRAPH_LAUNCH):
        with pytest.raises(dg.CudaError) as e:
            ex.step(p.seq_lens, p.block_tables, slots_for(p.block_tables, p.seq_lens, 16))
    assert e.value.code == 999 and e.value.context_lost is False and "injected" in str(e.value)
    good_step(ex, p, rng)


def test_plain_error_kinds(rng):
    p = make_problem(rng, lens=[10, 20])
    kept = []

    def body(ctx):
        kept.append(ctx)
        ctx.attention(0)

    ex = host_executor(p, max_batch=2, max_seq_len=32, step_body=body, append_kv=False)
    ex.step(p.seq_lens, p.block_tables)
    with pytest.raises(dg.Error, match="only inside the body") as e:
        kept[0].attention(0)
    assert type(e.value) is dg.Error

    def reentrant(ctx):
        ex2.step(p.seq_lens, p.block_tables)

    ex2 = host_executor(p, max_batch=2, max_seq_len=32, step_body=reentrant, append_kv=False)
    with pytest.raises(dg.Error, match="inside this executor's step body"):
        ex2.step(p.seq_lens, p.block_tables)


@pytest.mark.skipif(dg.built_with_cuda(), reason="checks the host-only build's answer to CUDA work")
def test_cuda_work_in_a_host_only_build(rng):
    p = make_problem(rng, lens=[10])
    with pytest.raises(dg.InvalidArgument, match="this build has no CUDA"):
        host_executor(p, backend="cuda")
    # CUDA arrays (never dereferenced): the eager launcher says the build has no CUDA.
    arrays = [FakeCudaArray(a.shape, "<f4") for a in (p.q, p.q, p.k_cache, p.v_cache)]
    with pytest.raises(dg.Error, match="built without CUDA") as e:
        dg.paged_attention_v1(arrays[1], arrays[0], arrays[2], arrays[3], FakeCudaArray((1, 1)), FakeCudaArray((1,)))
    assert type(e.value) is dg.Error


@pytest.mark.skipif(not dg.built_with_cuda() or dg.cuda_device_available(),
                    reason="needs a CUDA build on a machine without a CUDA device (the arrays here are fake)")
def test_cuda_error_from_the_runtime_without_a_device(rng):
    # A real CUDA failure, not an injected one: launching where no device is present.
    p = make_problem(rng, lens=[10])
    arrays = [FakeCudaArray(a.shape, "<f4") for a in (p.q, p.q, p.k_cache, p.v_cache)]
    with pytest.raises(dg.CudaError) as e:
        dg.paged_attention_v1(arrays[1], arrays[0], arrays[2], arrays[3], FakeCudaArray((1, 1)), FakeCudaArray((1,)))
    assert e.value.code not in (0, 999) and str(e.value)


# ------------------------------------------------------------------ bad arrays

STEP_CASES = [
    # (argument position, replacement factory, message fragment)
    ("seq_lens", lambda p: p.seq_lens.astype(np.float32), "seq_lens.dtype = float32 is invalid; allowed: int32"),
    ("seq_lens", lambda p: p.seq_lens.astype(np.int64), "seq_lens.dtype = int64"),
    ("seq_lens", lambda p: p.seq_lens.reshape(1, -1), "seq_lens.shape = (1, 2)"),
    ("seq_lens", lambda p: np.repeat(p.seq_lens, 2)[::2], "seq_lens.strides"),
    ("seq_lens", lambda p: list(p.seq_lens), "seq_lens = an object of type list"),
    ("seq_lens", lambda p: None, "seq_lens = None"),
    ("seq_lens", lambda p: RefusesExport(), "seq_lens = an array whose __dlpack__() failed (cannot export: requires grad)"),
    ("seq_lens", lambda p: FakeCudaArray(p.seq_lens.shape), "seq_lens.device = cuda:0 is invalid; allowed: host memory"),
    ("block_tables", lambda p: p.block_tables.astype(np.int64), "block_tables.dtype = int64"),
    ("block_tables", lambda p: p.block_tables[:1], "block_tables.shape = (1, 2)"),
    ("block_tables", lambda p: np.asfortranarray(np.repeat(p.block_tables, 2, axis=1)), "block_tables.strides"),
    ("block_tables", lambda p: np.repeat(p.block_tables, 2, axis=1)[:, ::2], "block_tables.strides"),
    ("slot_mapping", lambda p: slots_for(p.block_tables, p.seq_lens, 16).astype(np.int32), "slot_mapping.dtype = int32"),
    ("slot_mapping", lambda p: np.zeros(3, dtype=np.int64), "slot_mapping.shape = (3,)"),
]


@pytest.mark.parametrize("arg,make,message", STEP_CASES, ids=[f"{c[0]}-{c[2][:24]}" for c in STEP_CASES])
def test_bad_step_arrays_name_the_argument(rng, arg, make, message):
    p = make_problem(rng, lens=[10, 20], width=2)
    ex = host_executor(p, max_batch=2, max_seq_len=32)
    args = {"seq_lens": p.seq_lens, "block_tables": p.block_tables,
            "slot_mapping": slots_for(p.block_tables, p.seq_lens, 16)}
    args[arg] = make(p)
    with pytest.raises(dg.InvalidArgument) as e:
        ex.step(args["seq_lens"], args["block_tables"], args["slot_mapping"])
    assert message in str(e.value)
    good_step(ex, p, rng)


LAYER_CASES = [
    ("k_cache", lambda p: p.k_cache.astype(np.float16), "layers[0].k_cache.dtype = float16 is invalid; allowed: float32"),
    ("k_cache", lambda p: p.k_cache[:, :, :, :, :2], "layers[0].k_cache.shape"),
    ("k_cache", lambda p: p.k_cache[:3], "layers[0].k_cache.shape[0] = 3 is invalid; allowed: at least num_blocks"),
    ("v_cache", lambda p: np.asfortranarray(p.v_cache), "layers[0].v_cache.strides"),
    ("v_cache", lambda p: p.k_cache, "layers[0].v_cache.shape"),
    ("k_cache", lambda p: readonly(p.k_cache), "layers[0].k_cache = a read-only array"),
    ("k_cache", lambda p: FakeCudaArray(p.k_cache.shape, "<f4"), "layers[0].k_cache.device = cuda:0"),
    ("q", lambda p: np.zeros((1, 4, 64), np.float32), "layers[0].q.shape[0] = 1 is invalid; allowed: at least max_batch = 2"),
    ("q", lambda p: np.zeros((2, 64, 4), np.float32).transpose(0, 2, 1), "layers[0].q.strides"),
    ("q", lambda p: np.zeros((2, 8, 32), np.float32), "layers[0].q.shape"),
    ("q", lambda p: np.zeros((2, 258), np.float32)[:, :256], "layers[0].q.strides[0] = 258"),  # 1032 B: not 16-aligned
    ("out", lambda p: readonly(np.zeros((2, 4, 64), np.float32)), "layers[0].out = a read-only array"),
    ("new_key", lambda p: np.zeros((2, 4, 64), np.float32), "layers[0].new_key.shape"),
]


def readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("field,make,message", LAYER_CASES, ids=[f"{c[0]}-{c[2][10:40]}" for c in LAYER_CASES])
def test_bad_layer_arrays_name_the_argument(rng, field, make, message):
    p = make_problem(rng, dtype="fp32", layout="vllm", hq=4, hkv=1, d=64, bs=16, lens=[10, 20], width=2)
    kw = {"k_cache": p.k_cache, "v_cache": p.v_cache, field: make(p)}
    with pytest.raises(dg.InvalidArgument) as e:
        dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(**kw)], max_batch=2, max_seq_len=32,
                    num_blocks=p.num_blocks, backend="host")
    assert message in str(e.value)


def test_bad_layers_in_rebind_change_nothing(rng):
    p = make_problem(rng, lens=[10, 20], width=2)
    ex = host_executor(p, max_batch=2, max_seq_len=32)
    before = ex.config.layers
    with pytest.raises(dg.InvalidArgument, match="layers\\[0\\].v_cache.dtype"):
        ex.rebind_layers([dg.LayerBuffers(p.k_cache.copy(), p.v_cache.astype(np.float16))])
    assert ex.config.layers is before
    good_step(ex, p, rng)


EAGER_CASES = [
    ("q", lambda p: p.q.astype(np.float16), "k_cache.dtype = float32 is invalid; allowed: float16, as q"),
    ("q", lambda p: p.q[:, :, :32], "head_size = 32 is invalid"),
    ("q", lambda p: p.q[:, :3], "out.shape = (2, 4, 64)"),  # 3 query heads: out (4) does not match

    ("q", lambda p: np.ascontiguousarray(p.q.transpose(0, 2, 1)).transpose(0, 2, 1), "q.strides"),
    ("out", lambda p: readonly(p.out()), "out = a read-only array"),
    ("out", lambda p: p.out()[:1], "out.shape[0] = 1"),
    ("out", lambda p: p.out().astype(np.float64), "out.dtype = float64"),
    ("k_cache", lambda p: p.k_cache[..., 0], "block_size = 1 is invalid; allowed: 8, 16, 32 (read from the "
                                             "shapes of q (2, 4, 64) and k_cache (6, 1, 16, 16)"),  # 4-D: nhd
    ("k_cache", lambda p: p.k_cache[0], "(read from the shapes of q (2, 4, 64) and k_cache (1, 16, 16, 4))"),
    ("v_cache", lambda p: np.asfortranarray(p.v_cache), "v_cache.strides"),
    ("block_tables", lambda p: p.block_tables.astype(np.uint32), "block_tables.dtype = uint32"),
    ("seq_lens", lambda p: FakeCudaArray((2,)), "seq_lens.device = cuda:0 is invalid; allowed: host, where q is"),
    ("alibi_slopes", lambda p: np.ones(3, np.float32), "alibi_slopes.shape = (3,)"),
]


@pytest.mark.parametrize("arg,make,message", EAGER_CASES, ids=[f"{c[0]}-{c[2][:24]}" for c in EAGER_CASES])
def test_bad_eager_arrays_name_the_argument(rng, arg, make, message):
    p = make_problem(rng, dtype="fp32", layout="vllm", hq=4, hkv=1, d=64, bs=16, lens=[10, 20])
    args = {"out": p.out(), "q": p.q, "k_cache": p.k_cache, "v_cache": p.v_cache,
            "block_tables": p.block_tables, "seq_lens": p.seq_lens, "alibi_slopes": None}
    args[arg] = make(p)
    with pytest.raises(dg.InvalidArgument) as e:
        dg.paged_attention_v1(args["out"], args["q"], args["k_cache"], args["v_cache"], args["block_tables"],
                              args["seq_lens"], alibi_slopes=args["alibi_slopes"])
    assert message in str(e.value)


def test_bad_lengths_and_ids_in_eager_host_calls(rng):
    p = make_problem(rng, lens=[10, 20])
    bad = p.block_tables.copy()
    bad[0, 0] = -1
    with pytest.raises(dg.InvalidArgument, match=r"block_tables\[0\]\[0\] = -1"):
        dg.paged_attention_v1(p.out(), p.q, p.k_cache, p.v_cache, bad, p.seq_lens)
    with pytest.raises(dg.InvalidArgument, match="partition_size"):
        dg.paged_attention_v2(p.out(), p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, partition_size=20)
    key = np.zeros((1, 1, 64), np.float32)
    with pytest.raises(dg.InvalidArgument, match="slot_mapping"):
        dg.append_kv(key, key, p.k_cache, p.v_cache, np.array([p.num_blocks * 16], dtype=np.int64))
    with pytest.raises(dg.InvalidArgument, match="stream"):
        dg.paged_attention_v1(p.out(), p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, stream="s")
