"""Shared helpers: random paged-attention problems (never all zeros), dtypes, fixtures."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import List, Optional, Sequence

import ml_dtypes
import numpy as np
import pytest

import decodegraph as dg

NP_DTYPE = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32}


@dataclass
class Problem:
    spec: dg.AttentionSpec
    dtype: str
    layout: str
    q: np.ndarray             # [n, hq, d]
    k_cache: np.ndarray
    v_cache: np.ndarray
    block_tables: np.ndarray  # int32 [n, width]
    seq_lens: np.ndarray      # int32 [n]
    num_blocks: int

    @property
    def n(self) -> int:
        return int(self.seq_lens.shape[0])

    def out(self) -> np.ndarray:
        return np.full(self.q.shape, np.nan, dtype=self.q.dtype)


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: str, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(tuple(shape)) * scale).astype(NP_DTYPE[dtype])


def make_problem(rng: np.random.Generator, *, dtype: str = "fp32", layout: str = "vllm", hq: int = 4,
                 hkv: int = 1, d: int = 64, bs: int = 16, lens: Sequence[int] = (1, 17, 33),
                 width: Optional[int] = None, spare_blocks: int = 3) -> Problem:
    """Distinct, shuffled blocks per sequence (so a wrong table walk reads another sequence's data),
    table columns past a sequence's length filled with other valid ids."""
    spec = dg.AttentionSpec(num_q_heads=hq, num_kv_heads=hkv, head_size=d, block_size=bs, dtype=dtype,
                            layout=layout)
    need = [-(-max(int(length), 1) // bs) for length in lens]
    width = width or max(need)
    num_blocks = sum(need) + spare_blocks
    perm = rng.permutation(num_blocks).astype(np.int32)
    tables = rng.integers(0, num_blocks, size=(len(lens), width), dtype=np.int32)
    pos = 0
    for i, k in enumerate(need):
        tables[i, :k] = perm[pos:pos + k]
        pos += k
    return Problem(
        spec=spec, dtype=dtype, layout=layout,
        q=random_array(rng, (len(lens), hq, d), dtype),
        k_cache=random_array(rng, spec.k_cache_shape(num_blocks), dtype),
        v_cache=random_array(rng, spec.v_cache_shape(num_blocks), dtype),
        block_tables=tables, seq_lens=np.asarray(lens, dtype=np.int32), num_blocks=num_blocks)


def slots_for(tables: np.ndarray, lens: np.ndarray, bs: int) -> np.ndarray:
    """The slot of position len - 1 of each sequence (what step()'s slot_mapping holds)."""
    pos = lens.astype(np.int64) - 1
    return tables[np.arange(len(lens)), pos // bs].astype(np.int64) * bs + pos % bs


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    # A seed per test, stable across runs: the test's name hashed.
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _no_fault_left_armed():
    yield
    dg.fault.disarm_all()
    gc.collect()


def host_executor(p: Problem, layers: int = 1, **kw) -> dg.Executor:
    """An executor on the host backend over ``layers`` copies of p's caches."""
    bufs: List[dg.LayerBuffers] = [dg.LayerBuffers(p.k_cache.copy(), p.v_cache.copy()) for _ in range(layers)]
    kw.setdefault("max_batch", p.n)
    kw.setdefault("max_seq_len", int(p.block_tables.shape[1]) * p.spec.block_size)
    kw.setdefault("backend", "host")
    return dg.Executor(spec=p.spec, layers=bufs, **kw)
