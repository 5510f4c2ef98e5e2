"""The solvable models of the literature, side by side with their authors' training loops.

At one α each author's own PyTorch training runs for a few seeds one after another (as their
scripts run it), loaded from a checkout of their repository given by path (nothing of theirs
is kept here), and this package's study cell fits its instances in one compiled program on
the same settings. Printed per model: seconds per instance (wall time over instances, our
compilation included) and the error reached (mean ± std over instances).

- ``--positional PATH``: a checkout of SPOC-group/positional-and-semantic-attention. Their
  ``get_errors`` (``src/empirics_mixed_teacher_softmax.py``) on CPU: full-batch GD (lr 0.15,
  5000 steps) from the positional start, and their linear baseline (200 Adam steps), on
  50 000 test sequences; ours: the ``attention_phase`` cell (the linear baseline in closed
  form).
- ``--aim PATH``: a checkout of FabrizioBoncoraglio/BO_ExtensiveRankAttention. Their
  ``GD_run_averaged`` (``GD_softmax_averaged.py``; its definitions only, not its script
  lines, which run the authors' own grid at import) with one student per teacher; ours: the
  ``aim`` cell.

Needs PyTorch, which the package does not: ``pip install -e ".[bench]"``.

    python benchmarks/solvable_side_by_side.py --positional PATH --aim PATH
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_rows, machine, table


def _seconds(fn):
    tic = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - tic


def authors_positional(path: Path, alpha: float, dim: int, seeds: int, omega: float):
    """Their loop over seeds at one α from the positional start: (test errors, linear
    baseline's test errors, seconds)."""
    import matplotlib

    matplotlib.use("Agg")  # their training plots its loss curve and shows it
    sys.path.insert(0, str(path))
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        import src.empirics_mixed_teacher_softmax as theirs  # creates raw/ in the cwd

        theirs.device = "cpu"  # their module pins cuda:0
        with contextlib.redirect_stdout(io.StringIO()):  # they print every loss
            df, seconds = _seconds(
                lambda: theirs.get_errors(
                    [alpha],
                    d=dim,
                    L=2,
                    r=1,
                    sigma=0.5,
                    N_iter=seeds,
                    delta=0.4,
                    omega=omega,
                    lmbda_att=0.01,
                    lmbda_linear=1e-4,
                    informed=False,
                    optim="GD",
                    informed_position=True,
                )
            )
    row = df.iloc[0]
    return np.asarray(row["attention_gen_error"]), np.asarray(row["linear_gen_error"]), seconds


def authors_aim(path: Path, alpha: float, dim: int, seeds: int, steps: int):
    """Their ``GD_run_averaged`` once per seed (one Adam student per teacher): (errors,
    seconds)."""
    source = (path / "GD_softmax_averaged.py").read_text()
    tree = ast.parse(source)
    keep = (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)
    tree.body = [node for node in tree.body if isinstance(node, keep)]
    space: dict = {}
    exec(compile(tree, str(path / "GD_softmax_averaged.py"), "exec"), space)
    run = space["GD_run_averaged"]

    def every_seed():
        with contextlib.redirect_stdout(io.StringIO()):
            return [run(dim, 2, alpha, 0.5, steps, 1, learning_rate=0.1) for _ in range(seeds)]

    errors, seconds = _seconds(every_seed)
    return np.asarray(errors), seconds


def ours(study):
    from mhalearn.experiments import run_study

    ds, seconds = _seconds(lambda: run_study(study, quiet=True))
    return ds, seconds


def summary(values) -> str:
    values = np.asarray(values, float)
    return f"{values.mean():.5g} ± {values.std():.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positional", type=Path, help="checkout of the positional model's repo")
    parser.add_argument("--aim", type=Path, help="checkout of the AIM repository")
    parser.add_argument("--seeds", type=int, default=4, help="the authors' seeds (one by one)")
    parser.add_argument("--instances", type=int, default=64, help="our instances (one program)")
    parser.add_argument("--positional-alpha", type=float, default=1.0)
    parser.add_argument("--positional-dim", type=int, default=200)
    parser.add_argument("--aim-alpha", type=float, default=0.1)
    parser.add_argument("--aim-dim", type=int, default=40)
    args = parser.parse_args()
    if args.positional is None and args.aim is None:
        parser.error("give --positional PATH, --aim PATH or both (checkouts of the authors' code)")
    for path in (args.positional, args.aim):
        if path is not None and not path.is_dir():
            parser.error(f"{path}: not a directory")
    try:
        import torch
    except ImportError:
        sys.exit('needs PyTorch for the authors\' loops: pip install -e ".[bench]"')
    torch.set_num_threads(os.cpu_count() or 1)

    from mhalearn.batch import set_precision
    from mhalearn.experiments import AIM, AttentionPhase

    set_precision("float32")  # the authors train in float32
    rows = []
    if args.positional is not None:
        alpha, dim, omega = args.positional_alpha, args.positional_dim, 0.3
        errors, linear, seconds = authors_positional(args.positional, alpha, dim, args.seeds, omega)
        rows.append(
            dict(model="positional", who="authors (PyTorch, one seed at a time)", alpha=alpha,
                 dim=dim, instances=args.seeds, s_per_instance=seconds / args.seeds,
                 error=summary(errors), linear_error=summary(linear))
        )  # fmt: skip
        study = AttentionPhase(
            init=("positional",), alpha=(alpha,), omega=(omega,), dim=(dim,),
            test_samples=50_000, instances=args.instances,
        )  # fmt: skip
        ds, seconds = ours(study)
        rows.append(
            dict(model="positional", who="mhalearn (one program)", alpha=alpha, dim=dim,
                 instances=args.instances, s_per_instance=seconds / args.instances,
                 error=summary(ds["test_error"].values),
                 linear_error=summary(ds["linear_test_error"].values))
        )  # fmt: skip
    if args.aim is not None:
        alpha, dim, steps = args.aim_alpha, args.aim_dim, 1000
        errors, seconds = authors_aim(args.aim, alpha, dim, args.seeds, steps)
        rows.append(
            dict(model="aim", who="authors (PyTorch, one seed at a time)", alpha=alpha, dim=dim,
                 instances=args.seeds, s_per_instance=seconds / args.seeds, error=summary(errors),
                 linear_error="")
        )  # fmt: skip
        study = AIM(alpha=(alpha,), dim=(dim,), steps=steps, instances=args.instances)
        ds, seconds = ours(study)
        rows.append(
            dict(model="aim", who="mhalearn (one program)", alpha=alpha, dim=dim,
                 instances=args.instances, s_per_instance=seconds / args.instances,
                 error=summary(ds["mse"].values), linear_error="")
        )  # fmt: skip
    columns = ["model", "who", "alpha", "dim", "instances", "s_per_instance", "error"]
    columns += ["linear_error"] if args.positional is not None else []
    print(table(rows, columns))
    print(f"written to {append_rows('solvable_side_by_side', [{**r, **machine()} for r in rows])}")


if __name__ == "__main__":
    main()
