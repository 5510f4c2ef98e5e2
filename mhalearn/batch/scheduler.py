"""The engine's scheduler: a chunk's groups run on the devices — in one process each device's
host thread pulls the next group as soon as its last is done; across processes each device
takes an equal block — with the BLAS libraries held to one thread on CPU, and progress
reported as instances finish."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import Callable, Sequence

import jax
import numpy as np
import threadpoolctl
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import PyTree

from mhalearn.batch.devices import AXIS

#: ``progress(phase, done, total)``: phase ``"compiling"`` (done 0), ``"running"`` (``done``
#: of ``total`` instances finished) or ``"done"``. In one process the ``"running"`` calls come
#: from the threads that serve the devices (:func:`pulled`), one call at a time.
Progress = Callable[[str, int, int], None]


def host(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


#: the process's thread-pool libraries, found anew only once a module has been imported since
#: (finding them reads every loaded library, a sizeable share of a small call when done per
#: call; libraries are loaded by imports — SciPy's BLAS, which JAX's LAPACK calls, when JAX
#: first needs it)
_THREADPOOLS: dict[int, threadpoolctl.ThreadpoolController] = {}


def one_blas_thread(devices: Sequence[jax.Device]) -> contextlib.AbstractContextManager:
    """On CPU devices: the process's BLAS libraries held to one thread until the context
    exits (their own settings restored then); elsewhere nothing."""
    if devices[0].platform != "cpu":
        return contextlib.nullcontext()
    imported = len(sys.modules)
    if imported not in _THREADPOOLS:
        _THREADPOOLS.clear()
        _THREADPOOLS[imported] = threadpoolctl.ThreadpoolController()
    return _THREADPOOLS[imported].limit(limits=1, user_api="blas")


#: the host threads that dispatch groups, one per device, kept from call to call (started
#: anew for each call, they cost a sizeable share of a small one)
_DISPATCHERS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _dispatchers(count: int) -> concurrent.futures.ThreadPoolExecutor:
    if count not in _DISPATCHERS:
        _DISPATCHERS[count] = concurrent.futures.ThreadPoolExecutor(
            count, thread_name_prefix="mhalearn-dispatch"
        )
    return _DISPATCHERS[count]


def run_chunk(run_group, group_args, devs, mine, start, chunk, width, instances, report):
    """One chunk of instances, its results on the host: in one process, pulled by the
    devices (:func:`pulled`); across processes, a block per device (:func:`blocks`)."""
    rows = np.minimum(np.arange(start, start + chunk), instances - 1)  # pad with the last
    if jax.process_count() == 1:
        out = pulled(run_group, group_args, mine, rows, width, instances, report)
    else:
        out = blocks(run_group, group_args, devs, mine, rows, width, instances, report)
    valid = min(chunk, instances - start)
    return jax.tree.map(lambda a: a[:valid], out)


def pulled(run_group, group_args, devices, rows, width, instances, report):
    """The groups of ``rows`` (``width`` rows each, in order), each device taking the next
    one as soon as it has finished its last: a device whose instances take longer (more
    restarts, more iterations) runs fewer groups, and no device waits for another's share.
    One host thread per device dispatches a group and waits for its results; the next group
    is dispatched before that wait while at least two groups per device are left, so a device
    does not stand idle between groups. A result does not depend on the device that ran it
    (every device runs the same program)."""
    starts = collections.deque(range(0, rows.size, width))
    first_row = int(rows[0])  # the chunk's first instance
    lock = threading.Lock()
    stop = threading.Event()
    results: dict[int, PyTree] = {}
    finished = 0  # instances of this chunk done

    def take() -> int | None:
        with lock:
            return None if stop.is_set() or not starts else starts.popleft()

    def pull(device):
        nonlocal finished
        pending = collections.deque()  # (first row, group output) dispatched, not collected
        while True:
            depth = 2 if len(starts) >= 2 * len(devices) else 1  # plenty left: one ahead
            while len(pending) < depth and (g := take()) is not None:
                pending.append((g, run_group[device](*group_args(rows[g : g + width], device))))
            if not pending:
                return
            first, out = pending.popleft()
            host = jax.tree.map(np.asarray, out)  # waits for the group
            with lock:
                results[first] = host
                finished += max(0, min(width, instances - first_row - first))
                if report is not None:
                    report("running", first_row + finished, instances)

    def serve(device):
        try:
            pull(device)
        except BaseException:
            stop.set()  # the other devices take no new group
            raise

    served = [_dispatchers(len(devices)).submit(serve, d) for d in devices]
    try:
        done, _ = concurrent.futures.wait(served, return_when=concurrent.futures.FIRST_EXCEPTION)
        for f in done:
            f.result()  # the first error, as soon as any device meets it
    finally:  # an error or an interruption: no new groups (those running finish)
        stop.set()
        concurrent.futures.wait(served)
    order = sorted(results)
    return jax.tree.map(lambda *parts: np.concatenate(parts), *(results[g] for g in order))


def blocks(run_group, group_args, devs, mine, rows, width, instances, report):
    """The rows split into equal blocks, one per device (of every process), each device's
    groups dispatched asynchronously, round robin over the devices so that every device has
    work from the start; the results gathered over the processes."""
    chunk = rows.size
    block = chunk // len(devs)
    mesh = Mesh(np.array(devs), (AXIS,))
    split = NamedSharding(mesh, PartitionSpec(AXIS))
    groups = {d: [] for d in mine}
    dispatched = []  # (group, its first row) in dispatch order
    for g in range(0, block, width):
        for d in mine:
            lo = devs.index(d) * block + g
            groups[d].append(run_group[d](*group_args(rows[lo : lo + width], d)))  # async
            dispatched.append((groups[d][-1], int(rows[0]) + lo))
    if report is not None:  # groups finish roughly in dispatch order: wait for each
        for group, row in dispatched:
            jax.block_until_ready(group)
            report("running", min(row + width, instances), instances)
    outs = [stack_groups(gs, d) for d, gs in groups.items()]
    out = jax.tree.map(
        lambda *shards: jax.make_array_from_single_device_arrays(
            (chunk, *shards[0].shape[1:]), split, list(shards)
        ),
        *outs,
    )
    return jax.tree.map(host, out)


def stack_groups(groups: list[PyTree], device: jax.Device) -> PyTree:
    """One device's groups as one block, through the host: outputs are small, and a compiled
    concatenation would be compiled anew for every number of groups."""
    if len(groups) == 1:
        return groups[0]
    return jax.tree.map(
        lambda *parts: jax.device_put(np.concatenate([np.asarray(p) for p in parts]), device),
        *groups,
    )


def reporter(progress: bool | Progress, instances: int) -> Progress | None:
    """The progress callback: the one given, a tqdm bar of instances (``True``), or none."""
    if callable(progress):
        return progress
    if not progress:
        return None
    from tqdm import tqdm

    bar = tqdm(total=instances, unit="instance", desc="compiling", disable=None)

    def report(phase: str, done: int, total: int) -> None:
        bar.set_description_str(phase)
        bar.update(done - bar.n)
        if phase == "done":
            bar.close()

    return report
