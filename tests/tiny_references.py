"""The Datasets every built-in study gives at its tiny size, stored before a refactoring so
that the tests can hold the code after it to the numbers before it
(``test_every_study_at_tiny_equals_its_stored_dataset`` in tests/test_experiments.py).

    python tests/tiny_references.py      # writes tests/data/tiny/<study>.nc (float64)

Rerun it only where a change is *meant* to change a study's numbers, and say so in the commit.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "data" / "tiny"


def main() -> None:
    from mhalearn.batch import set_precision

    set_precision("float64")  # as the tests run them
    from mhalearn.experiments import STUDIES, run_study

    FOLDER.mkdir(parents=True, exist_ok=True)
    for name, cls in STUDIES.items():
        ds = run_study(cls.preset("tiny"))
        ds.to_netcdf(FOLDER / f"{name}.nc", engine="h5netcdf")
        print(f"{name}: {FOLDER / f'{name}.nc'}")


if __name__ == "__main__":
    main()
