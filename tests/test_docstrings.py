"""Every public name of the documented modules has a docstring of its own, so the API
reference (generated from docstrings) lists it."""

import ast
import importlib
import inspect
import pathlib

import pytest

MODULES = (
    "mhalearn",
    "mhalearn.learners",
    "mhalearn.metrics.recovery",
    "mhalearn.metrics.theory",
    "mhalearn.metrics.selection",
    "mhalearn.experiments",
    "mhalearn.store",
)


def documented_constants(module) -> set[str]:
    """Names assigned at the top of ``module``'s source and followed by a string."""
    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    out = set()
    for stmt, after in zip(tree.body, tree.body[1:], strict=False):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", 0)]
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def public(name: str):
    module = importlib.import_module(name)
    names = getattr(module, "__all__", None)
    if names is None:  # the module's own definitions
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_")
            and (inspect.isclass(v) or inspect.isfunction(v))
            and v.__module__ == name
        ]
    return [(name, n) for n in names if not n.startswith("__")]


@pytest.mark.parametrize(("module", "name"), [p for m in MODULES for p in public(m)])
def test_public_name_has_its_own_docstring(module, name):
    value = getattr(importlib.import_module(module), name)
    if inspect.isclass(value) or inspect.isfunction(value):
        doc = value.__dict__.get("__doc__") if inspect.isclass(value) else value.__doc__
        assert doc and not doc.startswith(f"{value.__name__}("), f"{module}.{name}"
    else:  # a constant: documented where it is defined
        homes = [importlib.import_module(m) for m in _submodules()]
        defined = [m for m in homes if name in vars(m) and name in documented_constants(m)]
        assert defined, f"{module}.{name}: no docstring after its assignment"


def _submodules() -> list[str]:
    """Every module of the package, packages' ``__init__`` included."""
    root = pathlib.Path(importlib.import_module("mhalearn").__file__).parent
    out = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        out.append(".".join(("mhalearn", *parts[: -1 if parts[-1] == "__init__" else None])))
    return out
