"""The Datasets every built-in study gives at its tiny size, stored before a refactoring so
that the tests can hold the code after it to the numbers before it
(``test_every_study_at_tiny_equals_its_stored_dataset`` in tests/test_experiments.py).

    python tests/tiny_references.py                      # tests/data/tiny/<study>.nc (float64)
    python tests/tiny_references.py --cpu NAME STUDY ...  # tests/data/tiny/NAME/<study>.nc

Rerun it only where a change is *meant* to change a study's numbers, and say so in the commit.

A study whose fits are chaotic (a GD fit that runs off, the pipeline's float32 phases) gives
other last digits on another kind of CPU, where jaxlib's compiled kernels take other paths:
``--cpu NAME`` stores that CPU's Datasets of the studies that differ there, computed by the
code of the first set, beside it, and the test holds a study to any of its stored sets.
"""

from __future__ import annotations

import argparse
from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "data" / "tiny"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", default=None, help="another kind of CPU's set, in its own folder")
    p.add_argument("studies", nargs="*", help="default: every study")
    args = p.parse_args()
    from mhalearn.batch import set_precision

    set_precision("float64")  # as the tests run them
    from mhalearn.experiments import STUDIES, run_study

    folder = FOLDER if args.cpu is None else FOLDER / args.cpu
    folder.mkdir(parents=True, exist_ok=True)
    for name in args.studies or list(STUDIES):
        ds = run_study(STUDIES[name].preset("tiny"))
        ds.to_netcdf(folder / f"{name}.nc", engine="h5netcdf")
        print(f"{name}: {folder / f'{name}.nc'}")


if __name__ == "__main__":
    main()
