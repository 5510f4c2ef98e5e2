"""One computation over every GPU of every host of a SLURM job (examples/slurm_distributed.sbatch).

Each process (one per node, started by srun) calls ``jax.distributed.initialize()``, which on
SLURM finds the coordinator and its own index in the job's environment; ``mh.simulate`` then
splits every chunk of instances over all devices of all processes, and every process receives
the full results, identical to a one-process run (the engine's keys are global). Process 0
writes them.

    srun python examples/distributed_simulate.py --instances 65536 --out results/distributed.nc
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--instances", type=int, default=4096)
    p.add_argument("--out", type=Path, default=Path("results/distributed.nc"))
    args = p.parse_args()
    jax.distributed.initialize()  # SLURM's environment says who is who

    import mhalearn as mh

    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=4, dim=16, tokens=8), samples=512)
    learner = mh.GDConfig(optimizer="gd", steps=1000, lr=0.05)
    res = mh.simulate(jax.random.key(0), task, learner, args.instances, chunk_size=16384)
    if jax.process_index() == 0:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        res.to_xarray().to_netcdf(args.out)
        print(
            f"{args.instances} instances on {jax.device_count()} devices of "
            f"{jax.process_count()} processes: {args.out}"
        )


if __name__ == "__main__":
    main()
