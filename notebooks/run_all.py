"""Execute every notebook in place (outputs saved), e.g. the published figures:

MHALEARN_NOTEBOOK_SIZE=full python notebooks/run_all.py      # writes docs/figures/*.png
python notebooks/run_all.py 03_certify_and_sculpt           # one notebook, small size
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> None:
    paths = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    if names:
        paths = [p for p in paths if p.stem in names or p.name in names]
    for path in paths:
        tic = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=3600, resources={"metadata": {"path": str(HERE)}}).execute()
        nbformat.write(nb, path)
        print(f"{path.name}: {time.perf_counter() - tic:.0f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
