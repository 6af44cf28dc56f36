"""The docs' examples run as written: every Python block in docs/*.md that begins with an import
is a whole example (signatures and fragments begin otherwise), and each runs on CPU."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
EXAMPLES = [(path.name, index, block)
            for path in sorted(DOCS.glob("*.md"))
            for index, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S))
            if block.startswith(("import ", "from "))]


def test_the_docs_have_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("name,index,block", EXAMPLES, ids=[f"{n}-{i}" for n, i, _ in EXAMPLES])
def test_a_docs_example_runs(name, index, block):
    exec(compile(block, f"docs/{name} block {index}", "exec"), {})
