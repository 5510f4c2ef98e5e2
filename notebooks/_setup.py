"""Shared by the notebooks: where figures go, and saving them only at full size.

Each notebook reads its size from ``MHALEARN_NOTEBOOK_SIZE`` in its first cell ("small", the
default, for CI; "full" for the published figures under docs/figures/).
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "pyproject.toml").exists())
FIGURES = ROOT / "docs" / "figures"
SIZES = ("small", "full")


def size() -> str:
    value = os.environ.get("MHALEARN_NOTEBOOK_SIZE", "small")
    if value not in SIZES:
        raise ValueError(f"MHALEARN_NOTEBOOK_SIZE must be one of {SIZES}, received {value!r}")
    return value


def publish(fig, name: str) -> None:
    """Save ``fig`` as docs/figures/NAME.png when running at full size."""
    if size() == "full":
        FIGURES.mkdir(parents=True, exist_ok=True)
        fig.savefig(FIGURES / f"{name}.png", dpi=110)


matplotlib.rcParams["figure.dpi"] = 80
