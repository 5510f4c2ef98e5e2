"""The README's code runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    namespace: dict = {}
    for block in blocks:  # the blocks build on one another, as in a session
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["Y"].shape == (1000, 4, 8)
    assert namespace["score"].shape == ()
    assert namespace["res"].trace["loss"].shape[0] == 12
    assert dict(namespace["ds"].sizes)["instance"] == 12
    assert namespace["sweep"].metrics["test_error"].shape == (24,)
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
