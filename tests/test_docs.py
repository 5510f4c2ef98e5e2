"""Every Python block of the README and of the documentation runs alone, in a fresh process,
and prints what the page says it prints: the ``text`` block right after it (its whole output),
or, line by line, the value after ``# →`` on a line that prints."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
#: ``print(...)  # → VALUE`` (an optional "  (why)" after it): the line must print VALUE
EXPECTED = re.compile(r"#\s*→\s*(.*?)(?:\s{2,}\(.*\))?\s*$")


def blocks() -> list[tuple[str, str, str | None]]:
    """(page:index, code, expected output or None) for every python block."""
    out = []
    for page in PAGES:
        fences = [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text())]
        python = [i for i, (lang, _) in enumerate(fences) if lang == "python"]
        for n, i in enumerate(python):
            after = fences[i + 1] if i + 1 < len(fences) else None
            output = after[1] if after and after[0] == "text" else None
            out.append((f"{page.relative_to(ROOT)}:{n}", fences[i][1], output))
    return out


BLOCKS = blocks()


def test_there_are_blocks_to_check():
    readme = [b for b in BLOCKS if b[0].startswith("README.md")]
    assert readme and len(BLOCKS) >= 10
    stated = sum(
        len(output.splitlines()) if output else len(EXPECTED.findall(code))
        for _, code, output in BLOCKS
    )
    assert stated >= 5  # printed lines whose text the pages state
    assert all(len(code.splitlines()) <= 30 for _, code, _ in readme)


#: the README's blocks run in the fast tier, the documentation's in the slow one
CASES = [
    pytest.param(*b, id=b[0], marks=() if b[0].startswith("README") else pytest.mark.slow)
    for b in BLOCKS
]


@pytest.mark.parametrize(("where", "code", "output"), CASES)
def test_block_runs_alone_and_prints_what_the_page_says(where, code, output):
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "docs_blocks.py")],
        input=code,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode == 0, f"{where} failed:\n{run.stderr[-3000:]}"
    printed = json.loads(run.stdout.splitlines()[-1])
    if output is not None:
        assert [text for _, text in printed] == output.rstrip("\n").split("\n"), where
        return
    checked = 0
    for lineno, line in enumerate(code.splitlines(), start=1):
        match = EXPECTED.search(line) if "print(" in line else None
        if match:
            assert [t for n, t in printed if n == lineno] == [match.group(1)], f"{where}:{lineno}"
            checked += 1
    assert checked or not printed, f"{where} prints but states none of its output"
