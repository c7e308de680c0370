"""The README's Python snippet runs as written (and so does docs/python.md's, the same one), and so
does docs/python.md's speculative-decoding example."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_python_snippet_runs(capsys):
    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) == 1, "one Python snippet in the README's Python section"
    assert blocks == python_blocks(ROOT / "docs" / "python.md")[:1], "docs/python.md's first snippet is the README's"
    exec(compile(blocks[0], "README.md", "exec"), {})
    assert "(2, 8, 128)" in capsys.readouterr().out


def test_python_md_speculative_decoding_example_runs(capsys):
    blocks = python_blocks(ROOT / "docs" / "python.md")
    assert len(blocks) == 2, "docs/python.md: the first step and the speculative-decoding example"
    assert "q_lens=[1, 4]" in blocks[1]
    exec(compile(blocks[1], "docs/python.md", "exec"), {})
    # The last step has n = 4 (step 5): its result, rows, plan and the graphs of both q_lens.
    assert capsys.readouterr().out.strip() == "4 (2, 4, 8, 64) 4 [1, 4]"
