"""The optimised whole-training-set kernels (mhalearn.layer) equal the reference kernels:
``kernels.mha`` mapped over samples and differentiated by ``jax.value_and_grad``, and the
float64 loop reference; values and gradients, float32 and float64, with the per-sample score
products in either form and with the training set laid out as lanes (samples minor)."""

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh
from mhalearn.layer import (
    LANES_MAX,
    LANES_MAX_BYTES,
    lanes_form,
    lanes_loss_and_grad,
    lay_out,
    layer_outputs,
    padded_samples,
    squared_loss_and_grad,
)
from tests import reference as ref

# (samples, heads, tokens, dim): odd and mutually distinct so a transposed axis cannot pass.
SIZES = [(5, 3, 4, 7), (2, 1, 2, 3), (3, 4, 3, 5), (4, 2, 7, 3), (1, 5, 1, 4)]
PRODUCTS = pytest.mark.parametrize("products", ["batched", "broadcast"])
#: the per-sample products' two forms, and the training set laid out as lanes
FORMS = pytest.mark.parametrize("products", ["batched", "broadcast", "lanes"])


def loss_and_grad(X, Y, theta, W, products):
    """``squared_loss_and_grad`` with the products' form, or through :class:`Lanes`."""
    if products == "lanes":
        return lanes_loss_and_grad(lay_out(X, Y), theta, W)
    return squared_loss_and_grad(X, Y, theta, W, products=products)


def draw(rng, n, heads, tokens, dim, dtype=np.float64, scale=0.5):
    X = rng.standard_normal((n, tokens, dim))
    Y = rng.standard_normal((n, tokens, dim))
    theta = scale * rng.standard_normal((heads, dim, dim))
    W = rng.standard_normal((heads, dim, dim)) / np.sqrt(dim)
    return tuple(jnp.asarray(a, dtype) for a in (X, Y, theta, W))


def reference_loss(X, Y, theta, W):
    """The reference: the one-sequence kernel under vmap, mean squared error."""
    pred = jax.vmap(mh.mha, in_axes=(0, None, None))(X, theta, W)
    return jnp.mean((pred - Y) ** 2)


@pytest.mark.slow
@FORMS
@pytest.mark.parametrize("n,heads,tokens,dim", SIZES)
def test_outputs_and_loss_match_loop_reference_float64(rng, n, heads, tokens, dim, products):
    X, Y, theta, W = draw(rng, n, heads, tokens, dim)
    loop = np.stack([ref.mha(x, theta, W) for x in X])
    if products != "lanes":  # (lanes serve gradients only)
        out = layer_outputs(X, theta, W, products=products)
        np.testing.assert_allclose(out, loop, rtol=0, atol=1e-12)
    loss, _ = loss_and_grad(X, Y, theta, W, products)
    np.testing.assert_allclose(loss, np.mean((loop - np.asarray(Y)) ** 2), rtol=1e-12)


@pytest.mark.slow
@FORMS
@pytest.mark.parametrize("n,heads,tokens,dim", SIZES)
def test_value_and_grad_equal_autodiff_of_reference_float64(rng, n, heads, tokens, dim, products):
    X, Y, theta, W = draw(rng, n, heads, tokens, dim)
    fn = jax.jit(functools.partial(loss_and_grad, products=products))
    loss, (g_theta, g_W) = fn(X, Y, theta, W)
    ref_loss, (r_theta, r_W) = jax.value_and_grad(reference_loss, argnums=(2, 3))(X, Y, theta, W)
    assert g_theta.dtype == g_W.dtype == jnp.float64
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    np.testing.assert_allclose(g_theta, r_theta, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(g_W, r_W, rtol=1e-10, atol=1e-13)


@pytest.mark.slow
@FORMS
@pytest.mark.parametrize("n,heads,tokens,dim", SIZES)
def test_float32_within_float32_tolerance_of_float64(rng, n, heads, tokens, dim, products):
    args32 = draw(rng, n, heads, tokens, dim, np.float32)
    args64 = tuple(a.astype(jnp.float64) for a in args32)  # the same numbers
    loss, grads = jax.jit(functools.partial(loss_and_grad, products=products))(*args32)
    ref_loss, ref_grads = jax.value_and_grad(reference_loss, argnums=(2, 3))(*args64)
    assert loss.dtype == jnp.float32 and all(g.dtype == jnp.float32 for g in grads)
    np.testing.assert_allclose(loss, ref_loss, rtol=2e-5)
    scale = max(float(jnp.max(jnp.abs(r))) for r in ref_grads)  # (the θ-gradient may be 0)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=2e-5 * scale)
    if products == "lanes":
        return
    out = layer_outputs(*args32[:1], *args32[2:], products=products)
    expected = jax.vmap(mh.mha, in_axes=(0, None, None))(args64[0], *args64[2:])
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


@FORMS
def test_gradient_matches_finite_differences_of_loop_reference(rng, products):
    """Independent of autodiff: central differences of the float64 loop reference."""
    X, Y, theta, W = (np.asarray(a) for a in draw(rng, 2, 2, 3, 3))

    def loop_loss(theta, W):
        return np.mean([(ref.mha(x, theta, W) - y) ** 2 for x, y in zip(X, Y, strict=True)])

    args = map(jnp.asarray, (X, Y, theta, W))
    _, (g_theta, g_W) = loss_and_grad(*args, products)
    eps = 1e-6
    for which, grad in ((0, g_theta), (1, g_W)):
        for idx in np.ndindex(theta.shape):
            params = [theta.copy(), W.copy()]
            params[which][idx] += eps
            up = loop_loss(*params)
            params[which][idx] -= 2 * eps
            down = loop_loss(*params)
            np.testing.assert_allclose(grad[idx], (up - down) / (2 * eps), rtol=1e-6, atol=1e-9)


@pytest.mark.slow
@FORMS
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_huge_scores_give_finite_values_and_gradients(rng, dtype, products):
    X, Y, theta, W = draw(rng, 3, 2, 5, 3, dtype, scale=1e4)
    loss, grads = loss_and_grad(X, Y, theta, W, products)
    assert np.isfinite(loss) and all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.slow
def test_problem_loss_and_grad_equals_autodiff_of_its_loss_with_minibatch(rng):
    X, Y, theta, W = draw(rng, 6, 3, 4, 5)
    problem = mh.RegressionProblem(X=X, Y=Y, heads=3)
    params = mh.LayerParams(theta=theta, W=W)
    for idx in (None, jnp.array([4, 0, 2])):
        loss, grads = eqx.filter_jit(problem.loss_and_grad)(params, idx)
        ref_loss, ref_grads = jax.value_and_grad(problem.loss)(params, idx)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
        for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-13)


@pytest.mark.slow
def test_vmap_over_instances_equals_python_loop(rng):
    stacks = [draw(rng, 4, 2, 3, 5) for _ in range(3)]
    batched = jax.vmap(squared_loss_and_grad)(*(jnp.stack(a) for a in zip(*stacks, strict=True)))
    for i, args in enumerate(stacks):
        one = squared_loss_and_grad(*args)
        for b, o in zip(jax.tree.leaves(batched), jax.tree.leaves(one), strict=True):
            np.testing.assert_allclose(b[i], o, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "X_shape,Y_shape,fragment",
    [((4, 3, 5), (4, 3, 4), "Y"), ((3, 5), (3, 5), "X"), ((4, 3, 6), (4, 3, 6), "dim")],
)
def test_bad_shapes_raise_value_error(rng, X_shape, Y_shape, fragment):
    theta = jnp.zeros((2, 5, 5))
    with pytest.raises(ValueError, match=fragment):
        squared_loss_and_grad(jnp.zeros(X_shape), jnp.zeros(Y_shape), theta, theta)


@pytest.mark.slow
@pytest.mark.parametrize(
    "tokens,dim,form",
    [(4, 8, "broadcast"), (8, 8, "broadcast"), (4, 9, "batched"), (9, 3, "batched")],
)
def test_auto_products_take_the_broadcast_form_only_for_small_sequences(rng, tokens, dim, form):
    """The default is one of the two forms, bit for bit: broadcast up to dim and tokens 8."""
    args = draw(rng, 3, 2, tokens, dim)
    auto = jax.jit(squared_loss_and_grad)(*args)
    chosen = jax.jit(functools.partial(squared_loss_and_grad, products=form))(*args)
    for a, c in zip(jax.tree.leaves(auto), jax.tree.leaves(chosen), strict=True):
        np.testing.assert_array_equal(a, c)
    X, _, theta, W = args
    np.testing.assert_array_equal(
        layer_outputs(X, theta, W), layer_outputs(X, theta, W, products=form)
    )


def test_unknown_products_form_raises(rng):
    X, Y, theta, W = draw(rng, 2, 1, 2, 3)
    with pytest.raises(ValueError, match="products"):
        squared_loss_and_grad(X, Y, theta, W, products="loop")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lanes_padded_with_zero_samples_equal_the_reference(rng, dtype):
    """At (128 samples, 4 tokens) a row of lanes takes 4 KiB in float64 (2 KiB in float32):
    padded in float64, not in float32; either way the loss and gradient are the reference's."""
    X, Y, theta, W = draw(rng, 128, 2, 4, 8, dtype)
    lanes = lay_out(X, Y)
    n = 130 if dtype == np.float64 else 128
    assert lanes.X.shape == (8, 4 * n) and lanes.Xs.shape == (8, 4, 4 * n) and lanes.samples == 128
    np.testing.assert_array_equal(lanes.X.reshape(8, 4, n)[:, :, 128:], 0)  # the padding
    np.testing.assert_array_equal(lanes.X.reshape(8, 4, n)[:, :, :128], X.transpose(2, 1, 0))
    for t in range(4):  # every query column sees every key of its sample
        block = lanes.Xs.reshape(8, 4, 4, n)[:, :, t, :128]
        np.testing.assert_array_equal(block, X.transpose(2, 1, 0))
    args64 = tuple(a.astype(jnp.float64) for a in (X, Y, theta, W))
    ref_loss, ref_grads = jax.value_and_grad(reference_loss, argnums=(2, 3))(*args64)
    loss, grads = jax.jit(lanes_loss_and_grad)(lanes, theta, W)
    rtol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(loss, ref_loss, rtol=rtol)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(r))))


@pytest.mark.parametrize("tokens", [1, 2, 3, 4, 7, 8, 16])
@pytest.mark.parametrize("itemsize", [4, 8])
def test_padded_rows_take_an_odd_number_of_cache_lines(tokens, itemsize):
    for n in (1, 31, 128, 255, 256, 1000, 1024, 4096):
        padded = padded_samples(n, tokens, itemsize)
        row = tokens * padded * itemsize  # bytes
        if tokens * n * itemsize < 4096 or tokens * itemsize % 128 == 0:
            assert padded == n  # small, or no row length works (a sample takes 128 bytes)
        else:
            assert n <= padded < n + 32 and row % 64 == 0 and (row // 64) % 2 == 1


def test_lanes_form_at_small_layers_and_within_its_memory():
    assert lanes_form(256, 2, 4, 8, 4) and lanes_form(512, 1, 8, 16, 4)
    at_most = LANES_MAX // (4 * 8)  # heads at tokens 4, dim 8: heads · dim · tokens ≤ LANES_MAX
    assert lanes_form(256, at_most, 4, 8, 4) and not lanes_form(256, at_most + 1, 4, 8, 4)
    n = LANES_MAX_BYTES // (6 * 4 * 8 * 4)  # (tokens + 2) · tokens · dim · 4 bytes a sample
    assert lanes_form(n - 64, 2, 4, 8, 4) and not lanes_form(n + 64, 2, 4, 8, 4)
    assert not lanes_form(32, 2, 4, 8, 8) and not lanes_form(256, 2, 4, 8, 8)  # float64


@pytest.mark.slow
def test_prepared_problem_lays_its_data_out_and_gives_the_same_gradients(rng):
    X, Y, theta, W = draw(rng, 300, 2, 4, 8)
    problem = mh.RegressionProblem(X=X, Y=Y, heads=2)
    assert mh.prepared(problem) is problem  # float64: samples major
    X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
    problem32 = mh.RegressionProblem(X=X32, Y=Y32, heads=2)
    ready32 = mh.prepared(problem32)
    assert problem32.lanes is None and ready32.lanes is not None
    assert mh.prepared(ready32) is ready32
    # the layout's gradients, in float64: laid out as a float32 problem would be
    ready = dataclasses.replace(problem, lanes=lay_out(X, Y))
    assert mh.prepared(ready) is ready
    params = mh.LayerParams(theta=theta, W=W)
    for idx in (None, jnp.array([7, 0, 299])):  # minibatches take their rows from X
        got = eqx.filter_jit(ready.loss_and_grad)(params, idx)
        want = eqx.filter_jit(problem.loss_and_grad)(params, idx)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-14)
    small = mh.RegressionProblem(X=X32[..., :3], Y=Y32[..., :3], heads=2)  # dim 3: lanes too
    assert mh.prepared(small).lanes is not None
    heads = LANES_MAX // (4 * 8) + 1  # heads · dim · tokens > LANES_MAX: samples major
    big = mh.RegressionProblem(X=X32, Y=Y32, heads=heads)
    assert mh.prepared(big) is big
