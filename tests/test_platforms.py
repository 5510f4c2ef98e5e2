"""The platform a program is traced for: JAX's default backend, or the device's the engine
lowers a program for, which the forms chosen per platform follow."""

import jax
import jax.numpy as jnp
import numpy as np

import mhalearn as mh
from mhalearn import fused, problems, teachers
from mhalearn.fused import fused_form
from mhalearn.learners import reduced
from mhalearn.platforms import lowering_for_gpu, platform, tracing_for


def test_tracing_for_names_the_platform_within_its_block_only():
    assert platform() == jax.default_backend()
    with tracing_for("gpu"):
        assert platform() == "gpu"
        with tracing_for("tpu"):
            assert platform() == "tpu"
        assert platform() == "gpu"
        with tracing_for(None):  # no device named: the default backend
            assert platform() == jax.default_backend()
    assert platform() == jax.default_backend()


def test_the_forms_follow_the_platform_traced_for(monkeypatch):
    monkeypatch.setattr(fused, "FUSED_ON_GPU", True)
    X = jnp.zeros((2000, 4, 3))

    def chunk():  # the samples a chunk of the Gauss–Newton sums takes by default
        return reduced._sample_chunks((X,), None)[1]

    assert teachers.default_candidates() == teachers.CANDIDATES["cpu"] == 1
    assert not fused_form(8, 16, jnp.float32)
    assert chunk() == reduced.CHUNK_ROWS["cpu"] // 4 == 128
    with tracing_for("gpu"):
        assert teachers.default_candidates() == 4
        assert fused_form(8, 16, jnp.float32)
        assert chunk() == 4096 // 4


def test_a_program_the_engine_places_on_the_cpu_of_a_gpu_machine_takes_the_cpus_forms(
    monkeypatch,
):
    # as on a GPU machine with the fused kernel on: JAX's default backend answers "gpu", so a
    # problem traced outside the engine takes the GPU's forms; the engine lowers its program
    # for the device it runs on, this CPU, and traces the CPU's: one draw at a time, no fused
    # kernel (here: it would fail the fit)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(fused, "FUSED_ON_GPU", True)
    assert teachers.default_candidates() == 4 and fused_form(4, 5, jnp.float32)

    def no_fused_kernel(*args, **kwargs):
        raise AssertionError("the fused kernel in a program for a CPU")

    monkeypatch.setattr(problems, "fused_loss_and_grad", no_fused_kernel)
    candidates = []
    default = teachers.default_candidates
    monkeypatch.setattr(
        teachers, "default_candidates", lambda: candidates.append(default()) or candidates[-1]
    )
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=5, tokens=4), samples=24)
    learner = mh.GDConfig(optimizer="gd", steps=4, lr=0.1, snapshots=2)
    mh.set_precision("float32")
    try:
        mh.batch.clear_programs()  # traced anew, not a program kept from another test
        res = mh.simulate(jax.random.key(0), task, learner, 2, devices=jax.devices("cpu")[:1])
    finally:
        mh.set_precision("float64")
    assert candidates and set(candidates) == {1}
    assert np.all(np.isfinite(res.metrics["train_loss"]))


def test_lowering_for_gpu_names_an_abstract_gpu_within_its_block_only():
    """The GPU that Pallas' Triton lowering reads on a machine without one (JAX ≥ 0.11), carried
    by an empty abstract mesh: nothing is sharded, and nothing is left after the block. That
    the fused kernel lowers for CUDA under it: tests/test_fused.py."""
    from jax.sharding import get_abstract_mesh

    before = get_abstract_mesh()
    with lowering_for_gpu("NVIDIA H200"):
        mesh = get_abstract_mesh()
        assert (mesh.abstract_device.device_kind, mesh.abstract_device.platform) == (
            "NVIDIA H200",
            "gpu",
        )
        assert mesh.axis_names == ()
    assert get_abstract_mesh() == before
