"""A toy two-layer model decoding a few sequences through decodegraph's executor, on the host backend.

Each token step is one executor.step(): the executor replays the step graph its bucket captured,
which holds the whole step through a step body (the C++ StepBody): per layer, a host callback
projects the residual stream to a fused QKV buffer, the executor appends the new K/V into the paged
cache and runs attention, and a second callback adds the attention's output projection back. The
sequences start from prompts of different lengths and grow by one token per step, so their lengths
cross the length bands; the run ends with the per-band table and a check of the last step against an
eager V1 call.

    python examples/python/decode_loop.py [--steps N] [--seed S]

Host backend: the timings are CPU timings, not GPU timings.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List

import numpy as np
import numpy.typing as npt

import decodegraph as dg

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]

SPEC = dg.AttentionSpec(num_q_heads=4, num_kv_heads=1, head_size=64, block_size=16,
                        dtype=dg.DType.BF16, layout=dg.KVLayout.VLLM)
LAYERS = 2
VOCAB = 97
MAX_BATCH = 4
MAX_SEQ_LEN = 512
BAND_EDGES = [64, 128, 256, 512]
V2_THRESHOLD = 128  # bands above 128 tokens always replay V2
PROMPT_LENS = [3, 40, 20, 60]
JOIN = [0, 30, 120, 200]  # the step at which each sequence starts


@dataclass
class ToyModel:
    """Weights and activations. Each layer's q | k | v live in one fused buffer the executor reads."""

    rng: np.random.Generator
    d_model: int = SPEC.num_q_heads * SPEC.head_size
    embed: F32 = field(init=False)
    w_qkv: List[F32] = field(init=False)
    w_out: List[F32] = field(init=False)
    unembed: F32 = field(init=False)
    x: F32 = field(init=False)          # residual stream [MAX_BATCH, d_model]
    qkv: List[Any] = field(init=False)  # per layer, bf16 [MAX_BATCH, (Hq + 2 Hkv) * D]
    out: List[Any] = field(init=False)  # per layer, bf16 [MAX_BATCH, Hq, D]

    def __post_init__(self) -> None:
        r, d = self.rng, self.d_model
        qkv_width = (SPEC.num_q_heads + 2 * SPEC.num_kv_heads) * SPEC.head_size
        bf16 = dg.numpy_dtype(SPEC.dtype)
        self.embed = r.standard_normal((VOCAB, d)).astype(np.float32)
        self.w_qkv = [(r.standard_normal((d, qkv_width)) / np.sqrt(d)).astype(np.float32) for _ in range(LAYERS)]
        self.w_out = [(r.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for _ in range(LAYERS)]
        self.unembed = (r.standard_normal((d, VOCAB)) / np.sqrt(d)).astype(np.float32)
        self.x = np.zeros((MAX_BATCH, d), dtype=np.float32)
        self.qkv = [np.zeros((MAX_BATCH, qkv_width), dtype=bf16) for _ in range(LAYERS)]
        self.out = [np.zeros((MAX_BATCH, SPEC.num_q_heads, SPEC.head_size), dtype=bf16) for _ in range(LAYERS)]

    def layer_buffers(self, k_cache: Any, v_cache: Any, layer: int) -> dg.LayerBuffers:
        hq, hkv = SPEC.num_q_heads * SPEC.head_size, SPEC.num_kv_heads * SPEC.head_size
        qkv = self.qkv[layer]  # strided slices of the fused buffer: no split copy
        return dg.LayerBuffers(k_cache=k_cache, v_cache=v_cache, q=qkv[:, :hq], new_key=qkv[:, hq:hq + hkv],
                               new_value=qkv[:, hq + hkv:], out=self.out[layer])

    def project_qkv(self, layer: int) -> None:
        h = self.x / np.sqrt((self.x * self.x).mean(axis=1, keepdims=True) + 1e-6)  # RMS norm
        self.qkv[layer][:] = h @ self.w_qkv[layer]

    def add_attention(self, layer: int) -> None:
        attn = self.out[layer].astype(np.float32).reshape(MAX_BATCH, -1)
        self.x += attn @ self.w_out[layer]

    def step_body(self, ctx: dg.StepContext) -> None:
        """Captured once per graph; the host callbacks run at every replay, in this order."""
        for layer in range(LAYERS):
            ctx.enqueue_host(functools.partial(self.project_qkv, layer))
            ctx.append_kv(layer)
            ctx.attention(layer)
            ctx.enqueue_host(functools.partial(self.add_attention, layer))

    def logits(self, n: int) -> F32:
        return np.asarray(self.x[:n] @ self.unembed, dtype=np.float32)


class Sequences:
    """Prompts, tokens and the paged cache's block tables (blocks taken as sequences grow). Sequence i
    joins the batch at step JOIN[i], so batch sizes and lengths differ across the run."""

    def __init__(self, rng: np.random.Generator, num_blocks: int) -> None:
        self.rng = rng
        self.prompts = [rng.integers(0, VOCAB, size=n).astype(np.int32) for n in PROMPT_LENS]
        self.tokens: List[List[int]] = [[int(p[0])] for p in self.prompts]
        self.free = list(range(num_blocks))
        width = MAX_SEQ_LEN // SPEC.block_size
        self.tables = np.zeros((len(self.prompts), width), dtype=np.int32)
        self.lens = np.zeros(len(self.prompts), dtype=np.int32)
        self.active = 0

    def advance(self, step: int) -> tuple[I32, npt.NDArray[np.int64], I32]:
        """Adds this step's token to every active sequence: its input token, and the slot of its K/V."""
        while self.active < len(JOIN) and JOIN[self.active] <= step:
            self.active += 1
        n, bs = self.active, SPEC.block_size
        slots = np.zeros(n, dtype=np.int64)
        for i in range(n):
            pos = int(self.lens[i])
            if pos % bs == 0:
                self.tables[i, pos // bs] = self.free.pop()
            slots[i] = int(self.tables[i, pos // bs]) * bs + pos % bs
        self.lens[:n] += 1
        inputs = np.array([self.tokens[i][-1] for i in range(n)], dtype=np.int32)
        return inputs, slots, self.lens[:n].copy()

    def accept(self, logits: F32) -> None:
        """Teacher-forces the prompt, then samples the model's own tokens (temperature 1)."""
        for i, row in enumerate(logits):
            pos = len(self.tokens[i])
            prompt = self.prompts[i]
            p = np.exp(row - row.max())
            sampled = int(self.rng.choice(VOCAB, p=p / p.sum()))
            self.tokens[i].append(int(prompt[pos]) if pos < len(prompt) else sampled)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="decode steps (default 300)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not 1 <= args.steps <= MAX_SEQ_LEN:
        parser.error(f"--steps: 1 .. {MAX_SEQ_LEN}")

    rng = np.random.default_rng(args.seed)
    model = ToyModel(rng)
    num_blocks = len(PROMPT_LENS) * MAX_SEQ_LEN // SPEC.block_size
    bf16 = dg.numpy_dtype(SPEC.dtype)
    caches = [(np.zeros(SPEC.k_cache_shape(num_blocks), dtype=bf16), np.zeros(SPEC.v_cache_shape(num_blocks), dtype=bf16))
              for _ in range(LAYERS)]
    config = dg.ExecutorConfig(
        spec=SPEC, layers=[model.layer_buffers(k, v, layer) for layer, (k, v) in enumerate(caches)],
        max_batch=MAX_BATCH, max_seq_len=MAX_SEQ_LEN, num_blocks=num_blocks, band_edges=BAND_EDGES,
        v2_threshold=V2_THRESHOLD, policy=dg.KernelPolicy.THRESHOLD, backend=dg.BackendKind.HOST)
    ex = dg.Executor(config, step_body=model.step_body)
    print(f"decodegraph {dg.__version__}; {ex}")
    print("backend: host. All timings are CPU timings of the host backend, NOT GPU timings.\n")
    print(ex.plan_table())

    seqs = Sequences(rng, num_blocks)
    per_plan: Dict[tuple[int, int], List[float]] = {}
    last: dg.StepResult | None = None
    for step in range(args.steps):
        inputs, slots, lens = seqs.advance(step)
        n = len(lens)
        model.x[:n] = model.embed[inputs]
        t0 = time.perf_counter()
        last = ex.step(lens, seqs.tables[:n], slots)
        per_plan.setdefault((last.bucket, last.band), []).append(time.perf_counter() - t0)
        seqs.accept(model.logits(n))
    assert last is not None

    print(f"per-band table ({args.steps} steps, {LAYERS} layers; whole steps, the numpy projections included):")
    print(f"{'batch':>5} {'band':>4} {'lengths':>12} {'kernel':>6} {'P':>5} {'steps':>6} {'mean ms':>8} {'min ms':>8}")
    for (bucket, band), times in sorted(per_plan.items()):
        plan = ex.plan_for(bucket, band)
        part = str(plan.partition_size) if plan.kernel is dg.KernelKind.V2 else "-"
        print(f"{plan.batch:>5} {band:>4} {f'({plan.band_lo},{plan.band_hi}]':>12} {plan.kernel.name.lower():>6} "
              f"{part:>5} {len(times):>6} {1e3 * sum(times) / len(times):>8.3f} {1e3 * min(times):>8.3f}")
    stats = ex.stats()
    print(f"\ngraphs captured {stats.total_captures}, steps {stats.steps}, replays V1 {stats.replays('v1')} / "
          f"V2 {stats.replays('v2')}; memory {ex.memory().total} bytes")
    for i, toks in enumerate(seqs.tokens):
        print(f"sequence {i}: joined at step {JOIN[i]:>3}, prompt {PROMPT_LENS[i]:>2} tokens, now "
              f"{int(seqs.lens[i]):>3}; last tokens {toks[-6:]}")

    # The last step's layer-0 attention again, eagerly (V1), on the same q and caches.
    n = seqs.active
    lb = ex.config.layers[0]
    eager = np.zeros((n, SPEC.num_q_heads, SPEC.head_size), dtype=bf16)
    q0 = np.asarray(lb.q)[:n].reshape(n, SPEC.num_q_heads, SPEC.head_size)
    dg.paged_attention_v1(eager, q0, lb.k_cache, lb.v_cache, seqs.tables[:n], seqs.lens[:n])
    graph = np.asarray(lb.out)[:n].astype(np.float64)
    # Each is within the library's bf16 bound of the exact value (docs/python.md, "Accuracy":
    # 1e-4 + 2^-8 |ref|, 1 % slack), so they are within twice it of each other (one may round up
    # where the other rounds down).
    e64 = eager.astype(np.float64)
    err = float(np.max(np.abs(graph - e64) / (2 * (1e-4 + 1.01 * 2.0**-8 * np.abs(e64)))))
    print(f"last step, layer 0: executor ({last.kernel.name}) against eager V1: worst error "
          f"{err:.2f} of twice the bf16 bound")
    if err > 1.0:
        print("MISMATCH between the executor and the eager call", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
