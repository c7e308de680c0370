"""The README's Python snippet runs as written (and so does docs/python.md's, the same one)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_python_snippet_runs(capsys):
    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) == 1, "one Python snippet in the README's Python section"
    assert blocks == python_blocks(ROOT / "docs" / "python.md")
    exec(compile(blocks[0], "README.md", "exec"), {})
    assert "(2, 8, 128)" in capsys.readouterr().out
