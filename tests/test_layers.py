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
    rel = path.relative_to(PACKAGE).as_posix()
    for i, entry in enumerate(order):
        if rel == entry or (entry.endswith("/") and rel.startswith(entry)):
            return i
    raise AssertionError(f"mhalearn/{rel} is not in docs/architecture.md's list")


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
    assert "kernels.py" in order and "cli.py" in order
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "__main__.py":
            continue
        mine = rank_of(path, order)
        for target in imported(path):
            same_folder = target.parent == path.parent and target.parent != PACKAGE
            if target != path and not same_folder and rank_of(target, order) >= mine:
                upward.append(f"{path.relative_to(ROOT)} imports {target.relative_to(ROOT)}")
    assert not upward, "\n".join(upward)


def test_the_check_sees_upward_imports_at_the_top_and_inside_functions(tmp_path):
    fake = tmp_path / "kernels.py"
    fake.write_text(
        "from mhalearn import plots\n\ndef f():\n    import mhalearn.cli\n    return plots\n"
    )
    targets = {t.relative_to(PACKAGE).as_posix() for t in imported(fake)}
    assert targets == {"plots.py", "cli.py"}
    order = layers()
    assert order.index("cli.py") > order.index("plots.py") > order.index("kernels.py")
