"""Run a small simulation and save its results; used by the engine tests in subprocesses.

python -m tests.engine.worker OUT.npz [--devices N] [--chunk N] [--width W]
    [--process I --processes P --port Q]
"""

import argparse

import jax
import numpy as np

from mhalearn.batch import set_precision

set_precision("float64")


def small_simulation(devices=None, chunk_size=None, vector_width=None):
    import mhalearn as mh

    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3, beta=2.0), samples=48, test_samples=16
    )
    lr = np.repeat(np.array([3e-3, 1e-2, 3e-2]), 4)
    learner = mh.GDConfig(optimizer="adam", steps=40, snapshots=6, lr=lr)
    return mh.simulate(
        jax.random.key(5),
        task,
        learner,
        12,
        key_ids=np.tile(np.arange(4), 3),
        devices=devices,
        chunk_size=chunk_size,
        vector_width=vector_width,
    )


def flatten(res) -> dict[str, np.ndarray]:
    out = {f"metric_{k}": v for k, v in res.metrics.items()}
    out.update({f"trace_{k}": v for k, v in res.trace.items()})
    out.update({f"status_{k}": v for k, v in res.status.items()})
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, nargs="*", default=[0])
    parser.add_argument("--chunk", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--process", type=int, default=None)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.process is not None:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=args.processes,
            process_id=args.process,
        )
    saved = {}
    for n in args.devices:
        res = small_simulation(devices=n or None, chunk_size=args.chunk, vector_width=args.width)
        res = flatten(res)
        saved.update({f"{n}/{k}": v for k, v in res.items()})
    saved["device_count"] = np.array(jax.device_count())
    if args.process in (None, 0):
        np.savez(args.out, **saved)


if __name__ == "__main__":
    main()
