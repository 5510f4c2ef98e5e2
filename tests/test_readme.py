"""The README as a front page: short, with the two commands, every study in its table, and
figures that exist. (Its code runs as written: tests/test_docs.py.)"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    assert max(len(line) for line in lines) <= 100
    text = README.read_text()
    for paper in ("arxiv.org/abs/2402.04084", "arxiv.org/abs/2310.12680"):
        assert paper in text


def test_readme_has_the_two_commands():
    text = README.read_text()
    assert re.search(r"pip install -e \. && \.venv/bin/mhalearn run$", text, flags=re.M)
    assert re.search(r'pip install -e "\.\[test\]" && .*python -m pytest', text)


def test_readme_lists_every_study_once():
    from mhalearn.options import options

    text = README.read_text()
    table = text[text.index("| study | what it tests |") :].split("\n\n")[0]
    rows = table.splitlines()[2:]
    studies = options()["studies"]
    assert len(rows) == len(studies)
    for name in studies:
        assert sum(line.startswith(f"| `{name}`") for line in rows) == 1, name


def test_every_figure_shown_exists_and_every_notebook_is_shown():
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    shown = set()
    for page in pages:
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page.read_text()):
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.name}: {target}"
            shown.add(path.name)
    science = (ROOT / "docs" / "science.md").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert f"`{notebook.stem}`" in science, notebook.stem
        assert any(name.startswith(notebook.stem[:3]) for name in shown), notebook.stem
