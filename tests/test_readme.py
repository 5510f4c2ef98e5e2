"""The README's code runs as written and prints what it says it prints."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
#: ``print(...)  # → VALUE`` (an optional "  (why)" after it): the line must print VALUE
EXPECTED = re.compile(r"#\s*→\s*(.*?)(?:\s{2,}\(.*\))?\s*$")


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def run_blocks() -> tuple[dict, list[tuple[int, int, str]]]:
    """Execute every block in one namespace (they build on one another, as in a session);
    returns the namespace and every printed line as (block, line number, text)."""
    printed: list[tuple[int, int, str]] = []
    namespace: dict = {}
    for b, block in enumerate(blocks()):
        name = f"<README block {b}>"

        def record(*args, b=b, name=name):
            import sys

            frame = sys._getframe(1)
            while frame.f_code.co_filename != name:  # printed from a loop or a function in it
                frame = frame.f_back
            printed.append((b, frame.f_lineno, " ".join(str(a) for a in args)))

        namespace["print"] = record
        exec(compile(block, name, "exec"), namespace)
    return namespace, printed


def test_readme_python_examples_run_and_print_what_they_say():
    assert blocks(), "the README has no python example"
    namespace, printed = run_blocks()
    checked = 0
    for b, block in enumerate(blocks()):
        for lineno, line in enumerate(block.splitlines(), start=1):
            match = EXPECTED.search(line) if "print(" in line else None
            if match:
                outputs = [text for bb, n, text in printed if (bb, n) == (b, lineno)]
                assert outputs == [match.group(1)], f"block {b}, line {lineno}: {line.strip()}"
                checked += 1
    assert checked >= 5
    # what the shapes and objects are, beyond the printed lines
    assert namespace["score"].shape == ()
    assert dict(namespace["ds"].sizes)["instance"] == 12
    assert namespace["results"].attrs["study"] == "regimes" and namespace["fig"].axes


def test_readme_lists_every_study_in_one_line():
    from mhalearn.experiments import STUDIES

    text = README.read_text()
    table = text[text.index("| study | what it runs |") :].split("\n\n")[0]
    rows = table.splitlines()[2:]
    assert len(rows) == len(STUDIES)
    for name in STUDIES:
        assert sum(line.startswith(f"| `{name}`") for line in rows) == 1, name


def test_readme_has_the_two_commands():
    text = README.read_text()
    assert "mhalearn run" in text
    assert re.search(r'pip install -e "\.\[test\]" && .*pytest', text)


def test_readme_figures_exist_and_every_notebook_is_shown():
    root = README.parent
    text = README.read_text()
    shown = re.findall(r"\(docs/figures/([\w.]+\.png)\)", text)
    assert shown and all((root / "docs" / "figures" / name).is_file() for name in shown)
    for notebook in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert f"`{notebook.stem}`" in text, notebook.stem
        assert any(name.startswith(notebook.stem[:3]) for name in shown), notebook.stem
