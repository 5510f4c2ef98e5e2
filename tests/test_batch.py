"""The engine: keys by global index, chunking, devices and hosts, one compilation."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import threadpoolctl

import mhalearn as mh
from tests.engine.compiles import count_compiles
from tests.engine.worker import flatten, small_simulation

ROOT = Path(__file__).resolve().parents[1]


def test_keys_are_fold_in_of_global_index():
    out = mh.map_instances(
        lambda k, p, s: jax.random.key_data(k), jax.random.key(4), 7, chunk_size=3
    )
    for i in range(7):
        np.testing.assert_array_equal(
            out[i], jax.random.key_data(jax.random.fold_in(jax.random.key(4), i))
        )
    ids = np.array([5, 5, 2])
    out = mh.map_instances(
        lambda k, p, s: jax.random.key_data(k), jax.random.key(4), 3, key_ids=ids
    )
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(
        out[2], jax.random.key_data(jax.random.fold_in(jax.random.key(4), 2))
    )


def test_progress_reports_compiling_then_every_instance_in_order():
    seen = []
    out = mh.map_instances(
        lambda k, p, s: p * 2.0,
        jax.random.key(0),
        5,
        np.arange(5.0),
        chunk_size=2,
        progress=lambda *event: seen.append(event),
    )
    np.testing.assert_array_equal(out, np.arange(5.0) * 2)
    assert seen[0] == ("compiling", 0, 5) and seen[-1] == ("done", 5, 5)
    running = [done for phase, done, total in seen if phase == "running"]
    assert running == sorted(running) and running[-1] == 5 and len(running) >= 5


def test_per_instance_and_shared_arguments():
    def fn(key, per, shared):
        return {
            "sum": per["a"] + shared["b"] * per["c"].sum(),
            "shape": jnp.asarray(per["c"].shape[0]),
        }

    per = {"a": np.arange(5.0), "c": np.ones((5, 3))}
    out = mh.map_instances(fn, jax.random.key(0), 5, per, {"b": 2.0}, chunk_size=2)
    np.testing.assert_array_equal(out["sum"], np.arange(5.0) + 6.0)
    np.testing.assert_array_equal(out["shape"], 3)


def test_outputs_of_every_dtype_and_shape_come_back_bit_for_bit():
    """A group's outputs travel to the host as one array of bytes: each comes back with its
    dtype, shape and value, as the function computed it."""

    def fn(key, per, shared):
        x = jax.random.normal(key, (3, 2), jnp.float32)
        return {
            "f32": x,
            "f64": (x.astype(jnp.float64) / 3.0, jnp.float64(1 / 7) * per),
            "int": jnp.arange(5, dtype=jnp.int32) * per.astype(jnp.int32),
            "bool": x > 0,
            "u8": jnp.uint8(per),
            "empty": jnp.zeros((0, 4)),
        }

    per = np.arange(6.0)
    for devices, width in ((1, 1), (1, 4), (None, 2)):
        out = mh.map_instances(fn, jax.random.key(3), 6, per, vector_width=width, devices=devices)
        for i in range(6):
            key = jax.random.fold_in(jax.random.key(3), i)
            want = jax.tree.map(np.asarray, fn(key, per[i], None))
            got = jax.tree.map(lambda a, i=i: a[i], out)
            assert jax.tree.structure(got) == jax.tree.structure(want)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape
                np.testing.assert_array_equal(g, w)


def assert_all_equal(runs: list[dict]) -> None:
    """Every run's arrays equal the first run's, bit for bit."""
    for other in runs[1:]:
        for name, value in runs[0].items():
            np.testing.assert_array_equal(other[name], value, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("width", [1, 4])
def test_results_identical_for_every_chunk_size(width):
    runs = [flatten(small_simulation(chunk_size=c, vector_width=width)) for c in (1, 3, None)]
    assert_all_equal(runs)


@pytest.mark.slow
def test_cpu_groups_are_loops_whose_width_changes_no_bit():
    """On CPU a group runs its instances one after another through the unbatched program."""
    runs = [flatten(small_simulation(vector_width=w)) for w in (1, 3, 12)]
    assert_all_equal(runs)


@pytest.mark.slow
def test_vmapped_groups_the_accelerators_run_are_bitwise_across_chunk_sizes(monkeypatch):
    """The accelerators' path (a vmapped group), run here on the one CPU device."""
    monkeypatch.setattr(mh.batch.mapping, "_looped", lambda devices: False)
    runs = [flatten(small_simulation(chunk_size=c, vector_width=4)) for c in (1, 5, None)]
    assert_all_equal(runs)


def test_instance_programs_multiply_float32_in_float32_unless_the_user_configured_otherwise():
    """Traced at "highest" (JAX's default is TensorFloat-32 on recent NVIDIA GPUs); a user's
    own ``jax_default_matmul_precision`` is kept."""
    x = jnp.ones((4, 4), jnp.float32)
    assert (
        "precision = [HIGHEST, HIGHEST]" in mh.batch.programs.lower(lambda a: a @ a, (x,)).as_text()
    )
    with jax.default_matmul_precision("tensorfloat32"):
        assert "HIGHEST" not in mh.batch.programs.lower(lambda a: a @ a, (x,)).as_text()


@pytest.mark.slow
def test_the_precision_the_engine_traces_at_changes_no_bit_on_cpu(monkeypatch):
    runs = [flatten(small_simulation())]
    mh.batch.clear_programs()
    monkeypatch.setattr(mh.batch.programs, "MATMUL_PRECISION", "default")
    runs.append(flatten(small_simulation()))
    assert_all_equal(runs)


def test_default_cpu_width_leaves_every_device_four_groups_or_more():
    cpu = jax.devices("cpu")
    assert mh.batch.default_vector_width(cpu, 4 * mh.batch.CPU_GROUP) == mh.batch.CPU_GROUP
    assert mh.batch.default_vector_width(cpu, 10**6) == mh.batch.CPU_GROUP
    for per_device in range(1, 4 * mh.batch.CPU_GROUP):
        width = mh.batch.default_vector_width(cpu, per_device)
        assert width & (width - 1) == 0  # a power of two
        assert width == 1 or per_device >= 4 * width  # four groups per device at least
        assert 2 * width > mh.batch.CPU_GROUP or per_device < 8 * width  # and the widest
    assert mh.batch.default_vector_width(cpu, 32) == 8
    assert mh.batch.default_vector_width(cpu, 7) == 1
    stats = {}
    mh.map_instances(lambda k, p, s: jnp.ones(2), jax.random.key(0), 200, stats=stats)
    assert stats["vector_width"] == mh.batch.CPU_GROUP


def run_worker(out, *args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.engine.worker", str(out), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc):
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out


@pytest.mark.slow
@pytest.mark.parametrize("width", [1, 4])
def test_one_versus_four_cpu_devices(tmp_path, width):
    four = run_worker(
        tmp_path / "four.npz",
        "--devices",
        "1",
        "4",
        "--width",
        str(width),
        env_extra={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
    )
    finish(four)
    saved = np.load(tmp_path / "four.npz")
    assert int(saved["device_count"]) == 4
    here = flatten(small_simulation(vector_width=width))  # this process: one CPU device
    for name, value in here.items():
        np.testing.assert_array_equal(saved[f"1/{name}"], saved[f"4/{name}"], err_msg=name)
        np.testing.assert_array_equal(saved[f"4/{name}"], value, err_msg=name)


HUNG_BEFORE = """
import jax, numpy as np, mhalearn as mh
mh.set_precision("float64")
mh.split_cpu(2)
task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=8, tokens=4), samples=32)
res = mh.simulate(jax.random.key(0), task, mh.VarProConfig(), 4, vector_width=2)
print("finished", np.isfinite(res.metrics["success"]).all())
"""


EIGENVALUES_UNDER_VMAP = """
import jax, jax.numpy as jnp, numpy as np, mhalearn as mh
mh.split_cpu(2)
from mhalearn.solvers import eigenvalues

def fn(key, _, __):  # the pipeline's min-norm points of sub-polyhedra: 128 × 128 Gram matrices
    a = jax.random.normal(key, (40, 128, 128))
    a = a @ jnp.swapaxes(a, 1, 2)
    body = lambda c, x: (c + jax.vmap(eigenvalues)(x)[:, -1].sum(), None)
    return jax.lax.scan(body, 0.0, a.reshape(10, 4, 128, 128))[0]

print("finished", np.isfinite(mh.map_instances(fn, jax.random.key(0), 8)).all())
"""


SCORES_UNDER_VMAP = """
import jax, numpy as np, mhalearn as mh
from mhalearn.metrics.recovery import parameter_errors
spec = mh.TeacherSpec(heads=4, dim=16, tokens=8)
draw = jax.vmap(lambda k: mh.sample_teacher(k, spec))
truth, fitted = (draw(jax.random.split(jax.random.key(i), 256)) for i in (0, 1))
score = jax.jit(jax.vmap(parameter_errors))
angles = [score(fitted, truth).span_angle for _ in range(50)]
print("finished", bool(np.isfinite(np.asarray(angles)).all()))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "program",
    [HUNG_BEFORE, EIGENVALUES_UNDER_VMAP, SCORES_UNDER_VMAP],
    ids=["vmapped-groups", "vmapped-eigenvalues", "vmapped-parameter-errors"],
)
def test_programs_that_hung_two_cpu_devices_finish(program):
    """Each hung for good on two CPU devices, both threads of XLA:CPU's intra-op pool waiting
    in a batched LAPACK call for pieces queued to that pool: groups of variable projection,
    when they were vmapped (now a loop), and eigenvalues vmapped through ``jnp.linalg.eigvalsh``
    where ``mhalearn.solvers.eigenvalues`` now stands (the pipeline's span phase hung so at heads 2,
    N 1000, in ``lapack_ssyevd_ffi``'s batch split), and on one CPU device the scores of 256
    instances vmapped (the span angle's two QR factorisations, which XLA:CPU ran at once, through
    ``jnp.linalg.qr`` where ``mhalearn.solvers.orthonormal_basis`` now stands: 3 runs of 3 hung
    before)."""
    proc = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    assert "finished True" in proc.stdout


#: each factorisation of mhalearn.solvers: jnp.linalg's own call and the shape of its input
FACTORISATIONS = {
    "eigenvalues": (jnp.linalg.eigvalsh, (6, 6)),
    "eigh": (jnp.linalg.eigh, (6, 6)),
    "singular_values": (lambda a: jnp.linalg.svd(a, compute_uv=False), (4, 9)),
    "svd": (lambda a: jnp.linalg.svd(a, full_matrices=False), (9, 4)),
    "spectral_norm": (lambda a: jnp.linalg.norm(a, ord=2, axis=(-2, -1)), (9, 4)),
    "orthonormal_basis": (lambda a: jnp.linalg.qr(a)[0], (9, 4)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FACTORISATIONS))
def test_factorisations_vmapped_are_the_batched_call_bit_for_bit(name):
    """Under (nested) vmap each factorisation gives jnp.linalg's batched call's bits, and on
    CPU it lowers to one matrix per LAPACK call."""
    from mhalearn import solvers

    ours, (theirs, shape) = getattr(solvers, name), FACTORISATIONS[name]
    a = jax.random.normal(jax.random.key(0), (2, 5, *shape))
    if shape[0] == shape[1]:  # symmetric
        a = a @ jnp.swapaxes(a, -1, -2)
    for got, want in zip(
        jax.tree.leaves(jax.jit(jax.vmap(jax.vmap(ours)))(a)),
        jax.tree.leaves(theirs(a)),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(
        jax.tree.leaves(ours(a[0, 0])), jax.tree.leaves(theirs(a[0, 0])), strict=True
    ):
        np.testing.assert_array_equal(got, want)
    text = jax.jit(jax.vmap(ours)).lower(a[0]).as_text()
    assert set(re.findall(r'num_batch_dims = "(\d+)"', text)) == {"0"}  # LAPACK, unbatched


def test_least_squares_vmapped_is_the_batched_call_bit_for_bit():
    """A shared matrix and batched right-hand sides: the matrix is broadcast, one system per
    LAPACK call."""
    from mhalearn.solvers import least_squares

    a = jax.random.normal(jax.random.key(0), (9, 4))
    b = jax.random.normal(jax.random.key(1), (3, 9))
    got = jax.jit(jax.vmap(least_squares, in_axes=(None, 0)))(a, b)
    want = jnp.stack([jnp.linalg.lstsq(a, b_i)[0] for b_i in b])
    np.testing.assert_array_equal(got, want)
    text = jax.jit(jax.vmap(least_squares, in_axes=(None, 0))).lower(a, b).as_text()
    assert set(re.findall(r'num_batch_dims = "(\d+)"', text)) == {"0"}


COMPILED_ONCE = """
import sys, jax, numpy as np, mhalearn as mh
mh.set_precision("float64")
mh.split_cpu(2)
mh.enable_compilation_cache(sys.argv[1])
task = mh.RegressionTask(
    teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=40, test_samples=16
)
learner = mh.VarProConfig(iterations=4, restarts=2)
runs = {}
for name, devices in (("two", 2), ("two again", 2), ("one", 1)):
    mh.batch.clear_programs()  # as a new process: the persistent cache only
    runs[name] = mh.simulate(jax.random.key(3), task, learner, 6, devices=devices)
    print(name, *(runs[name].attrs[f"programs_{h}"] for h in ("compiled", "relocated")))
for name in ("two", "two again"):
    same = all(
        np.array_equal(value, runs["one"].arrays()[k], equal_nan=True)
        for k, value in runs[name].arrays().items()
    )
    print(name, "same as one device", same)
"""


@pytest.mark.slow
def test_two_cpu_devices_compile_once_and_match_one_device_bit_for_bit(tmp_path):
    """The second CPU device runs the first one's binary, loaded, not compiled again — but
    not a binary read from the persistent cache (XLA:CPU cannot serialize it again whole: it
    ran as "function not found"), which is compiled for each device; the results are those
    of one device, bit for bit, either way."""
    proc = subprocess.run(
        [sys.executable, "-c", COMPILED_ONCE, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "two 1 1" in lines, proc.stdout  # compiled once, relocated once
    assert "two again 2 0" in lines, proc.stdout  # from the cache: never relocated
    assert "one 1 0" in lines, proc.stdout
    assert "two same as one device True" in lines, proc.stdout
    assert "two again same as one device True" in lines, proc.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_distributed_run_equals_one_process(tmp_path):
    port = str(free_port())
    procs = [
        run_worker(tmp_path / f"p{i}.npz", "--process", str(i), "--processes", "2", "--port", port)
        for i in range(2)
    ]
    for p in procs:
        finish(p)
    saved = np.load(tmp_path / "p0.npz")
    assert int(saved["device_count"]) == 2  # one CPU device in each process
    for name, value in flatten(small_simulation()).items():
        np.testing.assert_array_equal(saved[f"0/{name}"], value, err_msg=name)


def test_sweep_of_learning_rates_and_seeds_compiles_once():
    mh.batch.clear_programs()
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=32, test_samples=8
    )
    lrs = np.repeat(np.geomspace(1e-3, 1e-1, 8), 4)  # 8 learning rates × 4 seeds
    seeds = np.tile(np.arange(4), 8)
    with count_compiles() as names:
        res = mh.simulate(
            jax.random.key(0), task, mh.GDConfig(steps=20, lr=lrs), 32, key_ids=seeds, chunk_size=8
        )
    assert names.count("instance_group") == 1, names
    np.testing.assert_array_equal(res.sweep["learner.lr"], lrs)
    # the same seed under different learning rates saw the same teacher and data
    first = res.trace["loss"][:, 0]
    np.testing.assert_array_equal(first[seeds == 1], first[1])


@pytest.mark.slow
def test_a_repeated_structure_compiles_once_per_process_with_the_same_numbers():
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=2, dim=3, tokens=3), samples=24, test_samples=8
    )
    mh.batch.clear_programs()
    with count_compiles() as names:
        a = mh.simulate(jax.random.key(5), task, mh.GDConfig(steps=7, lr=0.02), 3)
        b = mh.simulate(jax.random.key(6), task, mh.GDConfig(steps=7, lr=0.05), 3)
        c = mh.simulate(jax.random.key(5), task, mh.GDConfig(steps=8, lr=0.02), 3)
    assert names.count("instance_group") == 2, names  # another seed and lr: no compilation
    assert b.attrs["compile_seconds"] < a.attrs["compile_seconds"] and c.trace_steps[-1] == 8
    assert (a.attrs["programs_compiled"], b.attrs["programs_kept"]) == (1, 1)
    mh.batch.clear_programs()
    fresh = mh.simulate(jax.random.key(6), task, mh.GDConfig(steps=7, lr=0.05), 3)
    for name, value in fresh.arrays().items():
        np.testing.assert_array_equal(b.arrays()[name], value, err_msg=name)


def _normal_pair(key, per, shared):
    """The smallest instance program: two normal draws (compiles in a fraction of a second)."""
    return jax.random.normal(key, (2,))


def _programs_compiled_across(monkeypatch, changes) -> int:
    """The instance programs compiled by one small run before the ``changes`` (each a call
    that patches a setting through ``monkeypatch``), one after each, and one after all are
    undone (which must find the first run's program). The engine keeps programs by a key
    that holds the settings, whatever the program: the smallest one shows it."""
    mh.batch.clear_programs()
    with count_compiles() as names:
        mh.map_instances(_normal_pair, jax.random.key(5), 2)
        for change in changes:
            change()
            mh.map_instances(_normal_pair, jax.random.key(5), 2)
        monkeypatch.undo()
        mh.map_instances(_normal_pair, jax.random.key(5), 2)
    return names.count("instance_group")


def test_a_change_of_the_fused_kernels_settings_compiles_anew(monkeypatch):
    """The kernel a GPU's steps take is decided when a program is traced, from
    ``mhalearn.fused``'s settings: a program kept from before a change of them is not run."""
    from mhalearn import fused

    changes = [
        lambda: monkeypatch.setattr(fused, "FUSED_ON_GPU", not fused.FUSED_ON_GPU),
        lambda: monkeypatch.setattr(fused, "WARPS", 2 * fused.WARPS),
    ]
    assert _programs_compiled_across(monkeypatch, changes) == 3


def test_a_change_of_the_forms_chosen_per_platform_compiles_anew(monkeypatch):
    """How many teacher draws a program makes side by side (``teachers.CANDIDATES``) and how
    many rows a chunk of the Gauss–Newton sums takes (``reduced.CHUNK_ROWS``) are read when it
    is traced: a program kept from before a change of either is not run, and undoing the
    changes finds the first program again."""
    from mhalearn import teachers
    from mhalearn.learners import reduced

    here = jax.default_backend()
    changes = [
        lambda: monkeypatch.setitem(teachers.CANDIDATES, here, 3),
        lambda: monkeypatch.setitem(reduced.CHUNK_ROWS, here, 64),
    ]
    assert _programs_compiled_across(monkeypatch, changes) == 3


def test_engine_bad_input():
    fn = lambda k, p, s: p  # noqa: E731
    with pytest.raises(
        ValueError, match=r"expected a leading axis of length instances = 4, received shape \(3,\)"
    ):
        mh.map_instances(fn, jax.random.key(0), 4, {"lr": np.ones(3)})
    with pytest.raises(ValueError, match="instances must be an integer >= 1"):
        mh.map_instances(fn, jax.random.key(0), 0)
    with pytest.raises(ValueError, match="devices must lie in"):
        mh.map_instances(fn, jax.random.key(0), 2, devices=5)
    with pytest.raises(ValueError, match="key_ids: expected integers of shape"):
        mh.map_instances(fn, jax.random.key(0), 2, key_ids=[0.5, 1.5])
    with pytest.raises(ValueError, match=r"key_ids must lie in \[0, 2\*\*32\)"):
        mh.map_instances(fn, jax.random.key(0), 2, key_ids=[-1, 3])


def test_split_cpu_after_jax_started_is_a_clear_error():
    jax.devices()  # the backend is up
    with pytest.raises(ValueError, match="before JAX first uses a device"):
        mh.split_cpu(2)


def _float32_fit(key, per, shared):
    """A float32 fit whose matrix products are large enough for XLA:CPU's library paths."""
    task = mh.RegressionTask(
        teacher=mh.TeacherSpec(heads=4, dim=16, tokens=8), samples=256, test_samples=16
    )
    k_problem, k_fit = jax.random.split(key)
    _, sampled = task.sample(k_problem)
    X, Y = (a.astype(jnp.float32) for a in (sampled.X, sampled.Y))
    problem = mh.RegressionProblem(X=X, Y=Y, heads=4)
    fit = mh.GDConfig(optimizer="gd", steps=5, lr=0.05, snapshots=2).fit(k_fit, problem)
    return {"loss": fit.trace.loss, **fit.params.__dict__}


def test_compiler_options_change_speed_not_results():
    options = mh.batch.compiler_options(jax.devices())
    on_cpu = jax.devices()[0].platform == "cpu"
    assert ("xla_cpu_experimental_ynn_fusion_type" in options) == on_cpu
    tuned = mh.map_instances(_float32_fit, jax.random.key(1), 3)
    plain = mh.map_instances(_float32_fit, jax.random.key(1), 3, options={})
    assert tuned["loss"].dtype == np.float32
    for name in tuned:
        np.testing.assert_allclose(tuned[name], plain[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_unknown_compiler_option_warns_and_compiles_without_it():
    with pytest.warns(RuntimeWarning, match="xla_cpu_no_such_option"):
        out = mh.map_instances(
            lambda k, p, s: jnp.ones(2) * 3,
            jax.random.key(0),
            2,
            options={"xla_cpu_no_such_option": True},
        )
    np.testing.assert_array_equal(out, 3.0)


def test_fitted_width_fills_half_the_memory_and_no_more_than_the_instances():
    from mhalearn.batch import MEMORY_SHARE, fitted_width

    gib = 2.0**30
    # 1 MiB per instance in 80 GiB: 40 960 fit in half of it, the largest power of two 32 768
    assert fitted_width(2.0**20, 80 * gib, 10**6) == 32768
    assert fitted_width(2.0**20, 80 * gib, 1000) == 1024  # no wider than the instances need
    assert fitted_width(2.0**20, 80 * gib, 1) == 1
    assert fitted_width(100 * gib, 80 * gib, 1000) == 1  # too large for one: still one
    for per, mem, n in [(3e5, 16 * gib, 5000), (7e6, 40 * gib, 123), (1.0, 1e6, 7)]:
        w = fitted_width(per, mem, n)
        assert w & (w - 1) == 0 and w * per <= max(MEMORY_SHARE * mem, per)
        assert w < 2 * n and (2 * w * per > MEMORY_SHARE * mem or w >= n)


def test_the_width_used_is_reported():
    stats = {}
    mh.map_instances(lambda k, p, s: jnp.ones(2), jax.random.key(0), 3, stats=stats)
    assert stats["vector_width"] == 1  # the CPU default
    mh.map_instances(lambda k, p, s: jnp.ones(2), jax.random.key(0), 3, vector_width=2, stats=stats)
    assert stats["vector_width"] == 2


def _blas_threads() -> int:
    return max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")


def test_blas_is_held_to_one_thread_while_cpu_instance_programs_run_and_restored_after():
    if jax.devices()[0].platform != "cpu":
        pytest.skip("the hold applies to CPU devices")

    def fn(key, p, s):
        x = jnp.linalg.solve(2.0 * jnp.eye(3), jax.random.normal(key, (3,)))  # jaxlib's LAPACK
        shape = jax.ShapeDtypeStruct((), jnp.int32)
        seen = jax.pure_callback(lambda: np.int32(_blas_threads()), shape)
        return seen + 0 * jnp.isnan(x).sum().astype(jnp.int32)

    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        seen = mh.map_instances(fn, jax.random.key(0), 4)
        after = _blas_threads()
    assert before == 2 and after == 2
    np.testing.assert_array_equal(seen, 1)


class _Held:
    """A group's output that is ready only once ``event`` is set (as a device still running)."""

    def __init__(self, value, event):
        self.value, self.event = value, event

    def __array__(self, dtype=None, copy=None):
        assert self.event.wait(60), "the other device never took the remaining groups"
        return np.asarray(self.value, dtype)


def test_a_free_device_pulls_the_groups_a_busy_one_has_not_started():
    """Device a's first group runs until every group has been dispatched:
    with groups pulled as devices come free, b runs 6 of the 8 (a holds 2: the one running
    and the one dispatched ahead), and the results come back in row order."""
    import threading

    from mhalearn.batch.scheduler import pulled

    served = {"a": [], "b": []}
    last_done, a_started = threading.Event(), threading.Event()

    def run(device):
        def group(rows):
            if device == "b":  # a takes its groups first
                assert a_started.wait(60)
            served[device].append(int(rows[0]))
            a_started.set()
            if len(served["a"]) + len(served["b"]) == 8:  # every group dispatched
                last_done.set()
            if device == "a" and len(served["a"]) == 1:
                return {"x": _Held(rows * 10, last_done)}
            return {"x": rows * 10}

        return group

    rows = np.arange(8)
    done = []
    out = pulled(
        {d: run(d) for d in "ab"},
        lambda r, d: (r,),
        ["a", "b"],
        rows,
        1,
        8,
        lambda phase, n, total: done.append(n),
    )
    np.testing.assert_array_equal(out["x"], rows * 10)
    assert sorted(served["a"] + served["b"]) == list(range(8))
    assert len(served["a"]) == 2 and len(served["b"]) == 6
    assert sorted(done) == done and done[-1] == 8


def test_an_error_in_one_devices_group_stops_the_pulling_and_is_raised():
    from mhalearn.batch.scheduler import pulled

    calls = []

    def group(rows):
        calls.append(int(rows[0]))
        if int(rows[0]) == 2:
            raise RuntimeError("group 2 failed")
        return {"x": rows}

    with pytest.raises(RuntimeError, match="group 2 failed"):
        pulled({d: group for d in "ab"}, lambda r, d: (r,), ["a", "b"], np.arange(64), 1, 64, None)
    assert len(calls) < 64  # the remaining groups were not run
