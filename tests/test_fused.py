"""The fused Pallas kernel (interpret mode on the CPU) against the layer's XLA kernel, and its
lowering for a GPU (Triton), which needs no GPU."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import mhalearn as mh
from mhalearn.fused import FORMS, fused_form, fused_loss_and_grad, pad_training_set
from mhalearn.layer import squared_loss_and_grad
from mhalearn.platforms import lowering_for_gpu


def _arrays(n, T, d, m, seed=0, beta=3.0):
    k = jax.random.split(jax.random.key(seed), 4)
    X = jax.random.normal(k[0], (n, T, d), jnp.float32)
    Y = jax.random.normal(k[1], (n, T, d), jnp.float32)
    theta = beta * jax.random.normal(k[2], (m, d, d), jnp.float32) / d
    W = jax.random.normal(k[3], (m, d, d), jnp.float32) / np.sqrt(d)
    return tuple(a.astype(jnp.float32) for a in (X, Y, theta, W))


#: every form, keeping each head's attention or forming it again for the backward pass
VARIANTS = pytest.mark.parametrize(
    "form, recompute", [(form, recompute) for form in FORMS for recompute in (False, True)]
)


def _close(got, want, rtol=2e-5):
    """Equal to float32 rounding, relative to each array's largest entry."""
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.max(np.abs(a - b)) <= rtol * np.max(np.abs(b)), np.max(np.abs(a - b))


# odd sizes (transposed axes cannot pass by accident), a sample count that leaves a part
# tile, one head, the standard benchmark shape's tokens and dim
# (and tokens 16 = a whole tile of the default size), in every variant
@VARIANTS
@pytest.mark.parametrize("n, T, d, m", [(33, 4, 5, 3), (7, 2, 3, 1), (24, 8, 16, 2), (5, 16, 3, 2)])
def test_fused_kernel_equals_the_xla_kernel(n, T, d, m, form, recompute):
    args = _arrays(n, T, d, m)
    got = fused_loss_and_grad(*args, form=form, recompute=recompute)
    _close(got, squared_loss_and_grad(*args))


@VARIANTS
def test_fused_kernel_over_instances_equals_the_xla_kernel(form, recompute):
    """Over instances (the kernel's grid), each instance its own training set and parameters:
    17 samples of 4 tokens leave a part tile."""
    batch = [_arrays(17, 4, 5, 2, seed=s) for s in range(3)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *batch)
    fn = functools.partial(fused_loss_and_grad, form=form, recompute=recompute)
    got = jax.vmap(fn)(*stacked)
    want = jax.vmap(squared_loss_and_grad)(*stacked)
    _close(got, want)


@VARIANTS
def test_a_larger_tile_gives_the_same_gradient(form, recompute):
    """32 rows per tile: several samples of 4 tokens, and a part tile of the 13 samples."""
    args = _arrays(13, 4, 5, 2)
    got = fused_loss_and_grad(*args, form=form, recompute=recompute, tile_rows=32)
    _close(got, squared_loss_and_grad(*args))


def test_fused_kernel_refuses_what_it_cannot_tile():
    X, Y, theta, W = _arrays(8, 3, 4, 2)
    with pytest.raises(ValueError, match="tokens must be a power of two"):
        fused_loss_and_grad(X, Y, theta, W)
    X, Y, theta, W = _arrays(8, 4, 4, 2)
    with pytest.raises(ValueError, match="float32"):
        fused_loss_and_grad(X.astype(jnp.float64), Y, theta, W)
    with pytest.raises(ValueError, match="form must be one of"):
        fused_loss_and_grad(X, Y, theta, W, form="rows")
    with pytest.raises(ValueError, match="tile_rows must be a power of two of at least 16"):
        fused_loss_and_grad(X, Y, theta, W, tile_rows=24)
    X, Y, theta, W = _arrays(8, 32, 4, 2)
    with pytest.raises(ValueError, match="tokens must be a power of two up to 16"):
        fused_loss_and_grad(X, Y, theta, W)


def test_which_problems_take_the_fused_kernel_once_turned_on(monkeypatch):
    """As on a GPU with the kernel turned on: float32, a power of two tokens up to a tile's
    rows, dimensions up to MAX_DIM; nothing on a CPU, nothing while it is off."""
    from mhalearn import fused

    assert not fused_form(8, 16, jnp.float32)  # this CPU
    monkeypatch.setattr(fused.jax, "default_backend", lambda: "gpu")
    assert not fused_form(8, 16, jnp.float32)  # off until a GPU measures it faster
    monkeypatch.setattr(fused, "FUSED_ON_GPU", True)
    assert fused_form(8, 16, jnp.float32) and fused_form(1, 5, jnp.float32)
    assert fused_form(fused.TILE_ROWS, fused.MAX_DIM, jnp.float32)
    assert not fused_form(2 * fused.TILE_ROWS, 16, jnp.float32)
    assert not fused_form(6, 16, jnp.float32)
    assert not fused_form(8, fused.MAX_DIM + 1, jnp.float32)
    assert not fused_form(8, 16, jnp.float64)


def _float32_problem(samples: int) -> mh.RegressionProblem:
    """A small regression problem whose training set is float32 (the kernel's precision)."""
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=5, tokens=4), samples=samples)
    _, problem = task.sample(jax.random.key(1))
    return dataclasses.replace(
        problem, X=problem.X.astype(jnp.float32), Y=problem.Y.astype(jnp.float32)
    )


def _as_on_a_gpu_with_the_kernel_on(monkeypatch):
    from mhalearn import fused

    monkeypatch.setattr(fused.jax, "default_backend", lambda: "gpu")  # a GPU machine's
    monkeypatch.setattr(fused, "FUSED_ON_GPU", True)


def _fits_alike(got, want):
    _close(got.trace.loss, want.trace.loss, rtol=1e-4)
    _close(got.params, want.params, rtol=1e-4)


def test_a_fused_problem_fits_as_the_xla_one(monkeypatch):
    problem = _float32_problem(40)
    config = mh.GDConfig(optimizer="gd", steps=12, lr=0.1, snapshots=3)
    plain = config.fit(jax.random.key(2), problem)
    # padded at every step, and (as a fit on a GPU prepares it) padded once
    _as_on_a_gpu_with_the_kernel_on(monkeypatch)
    prepared = problem.prepared()
    monkeypatch.undo()  # the kernel runs in interpret mode on this CPU
    assert prepared.fused and prepared.padded is not None
    for given in (dataclasses.replace(problem, fused=True), prepared):
        _fits_alike(config.fit(jax.random.key(2), given), plain)


def test_a_problem_prepared_for_a_gpu_runs_on_the_same_machines_cpu(monkeypatch):
    """A program placed on the host CPU of a GPU machine (``devices=jax.devices("cpu")``)
    whose problem was prepared for the kernel: its lowering for the CPU runs the kernel in
    interpret mode, not Triton (which does not lower for a CPU)."""
    problem = _float32_problem(24)
    config = mh.GDConfig(optimizer="gd", steps=6, lr=0.1, snapshots=2)
    plain = config.fit(jax.random.key(2), problem)
    _as_on_a_gpu_with_the_kernel_on(monkeypatch)
    assert problem.prepared().fused
    got = jax.jit(config.fit)(jax.random.key(2), problem)  # lowered for this CPU
    _fits_alike(got, plain)


def test_a_training_set_padded_once_is_the_one_padded_at_every_call():
    args = _arrays(18, 4, 5, 2)
    padded = pad_training_set(args[0], args[1])
    assert padded[0].shape == (5 * 16, 16)  # 18 samples, 4 to a tile of 16 rows: 5 tiles
    _close(fused_loss_and_grad(*args, padded=padded), fused_loss_and_grad(*args), rtol=0)
    with pytest.raises(ValueError, match=r"padded must be pad_training_set\(X, Y, 32\)"):
        fused_loss_and_grad(*args, tile_rows=32, padded=padded)


@VARIANTS
def test_fused_kernel_lowers_for_a_gpu_through_triton(form, recompute):
    args = _arrays(64, 8, 16, 4)
    stacked = jax.tree.map(lambda a: jnp.stack([a] * 5), args)
    # interpret mode or Triton left to the lowering, as in a fit: Triton for a CUDA GPU
    fn = jax.vmap(functools.partial(fused_loss_and_grad, form=form, recompute=recompute))
    with lowering_for_gpu():  # this machine has no GPU to read the target from
        text = export.export(
            jax.jit(fn),
            platforms=["cuda"],
            disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*stacked).mlir_module()
    calls = re.findall(r"custom_call @(\S+)\(", text)
    assert calls == ["__gpu$xla.gpu.triton"]  # one kernel, nothing else of size
    assert re.findall(r"grid_x = (\d+)", text) == ["5"]  # one program per instance
