"""The package's layers as the architecture page draws them: no module imports from one listed
below it."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mhalearn"


def layers() -> list[str]:
    """The architecture page's list, lowest layer first: paths relative to the package
    (``kernels.py``, ``learners/``)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```")[1]
    return re.findall(r"^  (\S+(?:\.py|/))\s", block, flags=re.M)


def rank_of(path: pathlib.Path, order: list[str]) -> int:
    """The rank of the most specific entry that holds ``path`` (a folder listed inside a
    listed folder is a layer of its own)."""
    rel = path.relative_to(PACKAGE).as_posix()
    holding = [
        (len(entry), i)
        for i, entry in enumerate(order)
        if rel == entry or (entry.endswith("/") and rel.startswith(entry))
    ]
    if not holding:
        raise AssertionError(f"mhalearn/{rel} is not in docs/architecture.md's list")
    return max(holding)[1]


def resolve(module: str) -> pathlib.Path:
    """The file of ``mhalearn.a.b`` (a module or a package's ``__init__.py``)."""
    parts = module.split(".")[1:]
    base = PACKAGE.joinpath(*parts)
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"


def imported(path: pathlib.Path) -> set[pathlib.Path]:
    """Every package module ``path`` imports, at the top or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {resolve(a.name) for a in node.names if a.name.startswith("mhalearn")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mhalearn"):
            for alias in node.names:  # from mhalearn import plots: the submodule
                sub = resolve(f"{node.module}.{alias.name}")
                out.add(sub if sub.is_file() else resolve(node.module))
    return out


def test_every_import_goes_down_the_layers():
    order = layers()
    assert "kernels.py" in order and "cli/" in order
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__main__.py":
            continue
        mine = rank_of(path, order)
        for target in imported(path):  # within a listed folder (its subfolders included)
            if rank_of(target, order) > mine:  # modules may import one another
                upward.append(f"{path.relative_to(ROOT)} imports {target.relative_to(ROOT)}")
    assert not upward, "\n".join(upward)


def test_the_check_sees_upward_imports_at_the_top_and_inside_functions(tmp_path):
    fake = tmp_path / "kernels.py"
    fake.write_text(
        "from mhalearn import plots\n\ndef f():\n    import mhalearn.store\n    return plots\n"
    )
    targets = {t.relative_to(PACKAGE).as_posix() for t in imported(fake)}
    assert targets == {"plots.py", "store.py"}
    order = layers()
    assert order.index("store.py") > order.index("plots.py") > order.index("kernels.py")


def test_studies_compute_and_never_plot():
    # a study's figure lives in experiments/figures/, apart from the study
    studies = [p for p in (PACKAGE / "experiments").glob("*.py")]
    plotting = {PACKAGE / "plots.py"}
    drawn = []
    for path in studies:
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if imported(path) & plotting or any(n.startswith("matplotlib") for n in names):
            drawn.append(path.name)
    assert studies and not drawn, drawn
