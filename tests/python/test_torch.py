"""torch tensors through DLPack: CPU tensors on the host backend, and (GPU runs) CUDA tensors on the CUDA
backend. Skipped, saying why, where torch is not installed (CI) or no CUDA device is present."""

from __future__ import annotations

import numpy as np
import pytest

import decodegraph as dg
import reference as ref
from conftest import make_problem, slots_for

torch = pytest.importorskip("torch", reason="torch is not installed; the torch tests run where it is")

TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def to_torch(a: np.ndarray, dtype: str, device: str = "cpu"):
    t = torch.from_numpy(np.ascontiguousarray(a.astype(np.float32))).to(TORCH_DTYPE[dtype])
    return t.to(device)


def to_numpy64(t) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy().astype(np.float64)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_cpu_tensors_eager(rng, dtype, layout):
    p = make_problem(rng, dtype=dtype, layout=layout, hq=8, hkv=2, d=64, bs=16, lens=[1, 17, 100])
    q, k, v = (to_torch(a, dtype) for a in (p.q, p.k_cache, p.v_cache))
    tables, lens = torch.from_numpy(p.block_tables), torch.from_numpy(p.seq_lens)
    want = ref.attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, layout, 16)
    out = torch.empty_like(q)
    assert dg.paged_attention_v1(out, q, k, v, tables, lens) is out
    ref.check_close(to_numpy64(out), want, dtype, "V1, torch CPU")
    dg.paged_attention_v2(out.zero_(), q, k, v, tables, lens, partition_size=32)
    ref.check_close(to_numpy64(out), want, dtype, "V2, torch CPU")


def test_cpu_tensor_errors_name_the_argument(rng):
    p = make_problem(rng, dtype="bf16", lens=[4, 9])
    q, k, v = (to_torch(a, "bf16") for a in (p.q, p.k_cache, p.v_cache))
    tables, lens = torch.from_numpy(p.block_tables), torch.from_numpy(p.seq_lens)
    with pytest.raises(dg.InvalidArgument, match="out.dtype = float16"):
        dg.paged_attention_v1(torch.empty(q.shape, dtype=torch.float16), q, k, v, tables, lens)
    with pytest.raises(dg.InvalidArgument, match="q.strides"):
        dg.paged_attention_v1(torch.empty_like(q), q.transpose(1, 2).contiguous().transpose(1, 2), k, v, tables, lens)


def test_executor_with_torch_cpu_caches(rng):
    p = make_problem(rng, dtype="bf16", layout="nhd", hq=4, hkv=1, d=64, bs=16, lens=[10, 33])
    k, v = to_torch(p.k_cache, "bf16"), to_torch(p.v_cache, "bf16")
    ex = dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(k, v)], max_batch=2, max_seq_len=48, backend="host")
    q = ex.query(0)  # numpy (ml_dtypes.bfloat16) on the host backend
    q[:2] = p.q
    ex.step(torch.from_numpy(p.seq_lens), torch.from_numpy(p.block_tables), torch.full((2,), -1, dtype=torch.int64))
    want = ref.attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, "nhd", 16)
    ref.check_close(ex.output(0)[:2], want, "bf16")


cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and dg.cuda_device_available()),
    reason="needs a CUDA device and a CUDA build of decodegraph (GPU runs)")


@cuda
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_cuda_tensors_eager_and_executor(rng, dtype, layout):
    dev = "cuda"
    lens = [1, 15, 16, 17, 300, 8193, 64]
    p = make_problem(rng, dtype=dtype, layout=layout, hq=8, hkv=2, d=128, bs=16, lens=lens)
    q, k, v = (to_torch(a, dtype, dev) for a in (p.q, p.k_cache, p.v_cache))
    tables = torch.from_numpy(p.block_tables).to(dev)
    seq_lens = torch.from_numpy(p.seq_lens).to(dev)
    want = ref.attention(p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, layout, 16)
    stream = torch.cuda.current_stream()

    out = torch.empty_like(q)
    dg.paged_attention_v1(out, q, k, v, tables, seq_lens, max_seq_len=8193, stream=stream)
    ref.check_close(to_numpy64(out), want, dtype, "V1, CUDA")
    ws = torch.empty(dg.v2_workspace_size(p.spec, len(lens), 8193, 512), dtype=torch.uint8, device=dev)
    dg.paged_attention_v2(out.zero_(), q, k, v, tables, seq_lens, partition_size=512, workspace=ws,
                          max_seq_len=8193, stream=stream.cuda_stream)
    ref.check_close(to_numpy64(out), want, dtype, "V2, CUDA")

    # The executor on CUDA: torch caches, device-resident inputs, the caller's stream; views are torch.
    kc, vc = k.clone(), v.clone()
    ex = dg.Executor(spec=p.spec, layers=[dg.LayerBuffers(kc, vc)], max_batch=8, max_seq_len=8704, backend="cuda")
    assert ex.backend is dg.BackendKind.CUDA
    ex.query(0)[: len(lens)] = q
    new_k = to_torch(np.asarray(rng.standard_normal((len(lens), 2, 128))), dtype, dev)
    new_v = to_torch(np.asarray(rng.standard_normal((len(lens), 2, 128))), dtype, dev)
    ex.new_key(0)[: len(lens)] = new_k
    ex.new_value(0)[: len(lens)] = new_v
    slots = torch.from_numpy(slots_for(p.block_tables, p.seq_lens, 16)).to(dev)
    ex.step(seq_lens, tables, slots, stream=stream, max_seq_len=8193)
    out0 = ex.output(0)
    assert isinstance(out0, torch.Tensor) and out0.device.type == "cuda"
    stream.synchronize()
    kn, vn = p.k_cache.copy(), p.v_cache.copy()
    ref.append(kn, vn, layout, to_numpy64(new_k), to_numpy64(new_v), slots.cpu().numpy(), 16)
    want = ref.attention(p.q, kn, vn, p.block_tables, p.seq_lens, layout, 16)
    ref.check_close(to_numpy64(out0[: len(lens)]), want, dtype, "executor step, CUDA")
    ex.check_errors()
