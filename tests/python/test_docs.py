"""docs/python.md's examples run as written: the README's Python snippet (docs/python.md's first, the
same one), the engine loop (prefill, a block allocator, continuous batching with padded rows,
speculative rollback) and the speculative-decoding example. And the bounds "Accuracy" states are
the ones the suite holds the binding to (reference.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import reference as ref

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def block_with(marker: str) -> str:
    found = [b for b in python_blocks(ROOT / "docs" / "python.md") if marker in b]
    assert len(found) == 1, f"one docs/python.md example with {marker!r}"
    return found[0]


def test_readme_python_snippet_runs(capsys):
    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) == 1, "one Python snippet in the README's Python section"
    assert blocks == python_blocks(ROOT / "docs" / "python.md")[:1], "docs/python.md's first snippet is the README's"
    exec(compile(blocks[0], "README.md", "exec"), {})
    assert "(2, 8, 128)" in capsys.readouterr().out


def test_python_md_engine_loop_runs(capsys):
    # Prefill through append_kv, a free list, admissions and retirements, padded rows, rollback of
    # rejected drafts; it checks its last step against an eager call itself.
    code = block_with("free = list(range(NUM_BLOCKS))")
    assert "dg.append_kv(" in code and "rollback" in code and "slot -1" in code
    exec(compile(code, "docs/python.md", "exec"), {})
    out = capsys.readouterr().out.strip()
    assert out == "1 finished, 4 running, 64 of 64 blocks accounted for; steps 40, rejected 0", out


def test_python_md_speculative_decoding_example_runs(capsys):
    code = block_with("committed = np.array([7, 30])")
    exec(compile(code, "docs/python.md", "exec"), {})
    # The last step has n = 4 (step 5): its result, rows, plan and the graphs of both q_lens.
    assert capsys.readouterr().out.strip() == "4 (2, 4, 8, 64) 4 [1, 4]"


def test_python_md_states_the_bounds_the_suite_uses():
    # "Accuracy" gives the per-dtype bound; reference.py must hold the binding to exactly it.
    text = (ROOT / "docs" / "python.md").read_text()
    rows = {m[0]: (m[1].strip(), m[2].strip())
            for m in re.findall(r"^\| (fp32|fp16|bf16) \| ([^|]+) \| ([^|]+) \|", text, flags=re.M)}
    assert set(rows) == {"fp32", "fp16", "bf16"}

    def value(cell: str) -> float:  # "5e-6", or "1.01 x 2^-11 = 4.93e-4"
        expr = cell.split(" = ")[0].replace(" x ", " * ").replace("^", "**")
        return float(eval(expr, {}))

    for dtype, (atol, rtol) in ref.TOLERANCE.items():
        stated = rows[dtype]
        assert np.isclose(value(stated[0]), atol) and np.isclose(value(stated[1]), rtol), (dtype, stated)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_bound_catches_an_output_two_ulps_off(dtype):
    # What tightening reference.py bought: an output 2 ulps off (what rounding the softmax weights
    # to the dtype costs, docs/design.md) passed the old bf16 / fp16 bounds and fails these.
    want = np.linspace(0.5, 1.0, 64)
    ulp = 2.0 ** (-7 if dtype == "bf16" else -10)  # at [0.5, 1)
    off = want * (1 + 2 * ulp)
    with pytest.raises(AssertionError, match="out of tolerance"):
        ref.check_close(off, want, dtype)
    old = {"bf16": (8e-3, 1.6e-2), "fp16": (1e-3, 2e-3)}[dtype]
    ref.check_close(off, want, dtype, tol=old)  # the old bound let it through
