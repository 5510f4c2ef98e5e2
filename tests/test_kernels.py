import itertools
from functools import partial

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh
from tests import reference as ref

# (heads, tokens, dim): odd and mutually distinct so a transposed axis cannot pass.
SIZES = [(3, 5, 7), (1, 2, 3), (4, 3, 5), (2, 7, 3), (5, 1, 4)]


def draw(rng, heads, tokens, dim, scale=0.5):
    X = rng.standard_normal((tokens, dim))
    theta = scale * rng.standard_normal((heads, dim, dim))
    W = rng.standard_normal((heads, dim, dim)) / np.sqrt(dim)
    return X, theta, W


# ---- values against the float64 loop reference ------------------------------------


@pytest.mark.parametrize("heads,tokens,dim", SIZES)
def test_layer_matches_loop_reference_float64(rng, heads, tokens, dim):
    X, theta, W = draw(rng, heads, tokens, dim)
    A = mh.attention_weights(X, theta)
    assert A.dtype == jnp.float64 and A.shape == (heads, tokens, tokens)
    np.testing.assert_allclose(A, ref.attention(X, X, theta), rtol=0, atol=1e-12)
    np.testing.assert_allclose(A.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(
        mh.head_features(X, theta), ref.attention(X, X, theta) @ X, rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(mh.mha(X, theta, W), ref.mha(X, theta, W), rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads,tokens,dim", SIZES)
def test_layer_float32_within_float32_tolerance(rng, heads, tokens, dim):
    X, theta, W = draw(rng, heads, tokens, dim)
    f32 = [a.astype(np.float32) for a in (X, theta, W)]
    out = mh.mha(*f32)
    assert out.dtype == jnp.float32
    expected = ref.mha(*[a.astype(np.float64) for a in f32])
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


# ---- invariances and limits -----------------------------------------------------------


@pytest.mark.parametrize("heads,tokens,dim", SIZES)
def test_head_permutation_leaves_layer_unchanged(rng, heads, tokens, dim):
    X, theta, W = draw(rng, heads, tokens, dim)
    perm = rng.permutation(heads)
    np.testing.assert_allclose(
        mh.mha(X, theta[perm], W[perm]), mh.mha(X, theta, W), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("heads,tokens,dim", SIZES)
def test_layer_is_odd(rng, heads, tokens, dim):
    X, theta, W = draw(rng, heads, tokens, dim)
    np.testing.assert_allclose(mh.mha(-X, theta, W), -mh.mha(X, theta, W), atol=1e-12)
    np.testing.assert_allclose(
        mh.attention_weights(-X, theta), mh.attention_weights(X, theta), atol=1e-14
    )


@pytest.mark.parametrize("heads,tokens,dim", SIZES)
def test_zero_theta_gives_mean_pooling(rng, heads, tokens, dim):
    X, _, W = draw(rng, heads, tokens, dim)
    ones = np.ones((tokens, tokens))
    expected = ones @ X @ W.sum(0) / tokens
    np.testing.assert_allclose(mh.mha(X, np.zeros_like(W), W), expected, atol=1e-12)


@pytest.mark.parametrize("heads,tokens,dim", SIZES)
def test_identical_tokens_give_rows_x_sum_w(rng, heads, tokens, dim):
    _, theta, W = draw(rng, heads, tokens, dim, scale=3.0)
    x = rng.choice([-1.0, 1.0], size=dim)
    X = np.tile(x, (tokens, 1))
    np.testing.assert_allclose(mh.mha(X, theta, W), np.tile(x @ W.sum(0), (tokens, 1)), atol=1e-12)


@pytest.mark.parametrize("dtype,scale", [(np.float64, 1e6), (np.float32, 1e4), (np.float32, 1e30)])
def test_huge_theta_gives_argmax_attention_without_nan(rng, dtype, scale):
    heads, tokens, dim = 3, 5, 7
    X, theta, W = (a.astype(dtype) for a in draw(rng, heads, tokens, dim))
    theta = theta * dtype(scale)
    scores = np.einsum("qd,hde,ke->hqk", X.astype(np.float64), theta.astype(np.float64), X)
    argmax = np.eye(tokens)[scores.argmax(-1)]
    A = mh.attention_weights(X, theta)
    assert np.all(np.isfinite(A))
    np.testing.assert_allclose(A, argmax, atol=1e-6)
    out = mh.mha(X, theta, W)
    assert np.all(np.isfinite(out))
    expected = np.einsum("hqk,kd,hde->qe", argmax, X.astype(np.float64), W.astype(np.float64))
    np.testing.assert_allclose(out, expected, atol=1e-4)


# ---- the classifier family ------------------------------------------------------------

QUERIES, READOUTS, SCALINGS = (
    ("all", "first", "prompt", "given"),
    ("matrix", "vector"),
    ("sqrt", "mean", "sum"),
)


def classifier_inputs(rng, spec, heads, tokens, dim):
    X = rng.standard_normal((tokens, dim))
    W = 0.7 * rng.standard_normal((heads, dim, dim))
    q = spec.queries(tokens)
    U = rng.standard_normal((heads, q, dim) if spec.readout == "matrix" else (heads, dim))
    vector = rng.standard_normal(dim) if spec.query in ("prompt", "given") else None
    return X, W, U, vector


def query_args(spec, vector):
    """The prompt or the sample's query token, as keyword arguments of the kernels."""
    return {"query_token": vector} if spec.query == "given" else {"prompt": vector}


@pytest.mark.parametrize(
    "query,readout,scaling", list(itertools.product(QUERIES, READOUTS, SCALINGS))
)
def test_classifier_matches_loop_reference(rng, query, readout, scaling):
    heads, tokens, dim = 3, 5, 7
    spec = mh.ClassifierSpec(query=query, readout=readout, head_scaling=scaling, temperature=0.6)
    X, W, U, vector = classifier_inputs(rng, spec, heads, tokens, dim)
    mask = np.array([1.0, 0.0, 1.0])
    for m in (None, mask):
        got = mh.classifier_score(X, W, U, spec, head_mask=m, **query_args(spec, vector))
        want = ref.classifier_score(
            X, W, U, query, readout, scaling, 0.6, mask=m, **query_args(spec, vector)
        )
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_vector_readout_is_matrix_readout_with_repeated_rows(rng):
    heads, tokens, dim = 3, 5, 7
    vec = mh.ClassifierSpec(readout="vector")
    X, W, u, _ = classifier_inputs(rng, vec, heads, tokens, dim)
    U = np.repeat(u[:, None, :], tokens, axis=1)
    np.testing.assert_allclose(
        mh.classifier_score(X, W, u, vec),
        mh.classifier_score(X, W, U, mh.ClassifierSpec()),
        rtol=1e-12,
    )


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("readout", READOUTS)
def test_classifier_gradients_equal_closed_form(rng, query, readout):
    heads, tokens, dim, tau = 3, 5, 7, 0.8
    spec = mh.ClassifierSpec(query=query, readout=readout, temperature=tau)
    X, W, U, vector = classifier_inputs(rng, spec, heads, tokens, dim)
    mask = np.array([1.0, 1.0, 0.0])
    score = partial(mh.classifier_score, spec=spec, head_mask=mask, **query_args(spec, vector))
    gW, gU = jax.grad(score, argnums=(1, 2))(X, W, U)
    alpha = 1 / np.sqrt(mask.sum())
    single = None if vector is None else vector[None]
    Q = {"all": X, "first": X[:1], "prompt": single, "given": single}[query]
    A = ref.attention(Q, X, W, tau)
    for h in range(heads):
        Uh = U[h] if readout == "matrix" else np.tile(U[h], (len(Q), 1))
        G = Uh @ X.T
        M = A[h] * (G - (A[h] * G).sum(1, keepdims=True))
        dU = alpha * mask[h] * (A[h] @ X)
        dU = dU if readout == "matrix" else dU.sum(0)
        np.testing.assert_allclose(gU[h], dU, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(
            gW[h], alpha * mask[h] * tau * Q.T @ M @ X, rtol=1e-10, atol=1e-12
        )


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("readout", READOUTS)
def test_zero_readout_gives_zero_attention_gradient(rng, query, readout):
    spec = mh.ClassifierSpec(query=query, readout=readout)
    X, W, U, vector = classifier_inputs(rng, spec, 3, 5, 7)
    score = partial(mh.classifier_score, spec=spec, **query_args(spec, vector))
    gW = jax.grad(score, argnums=1)(X, W, np.zeros_like(U))
    assert np.all(gW == 0)
    assert np.any(jax.grad(score, argnums=1)(X, W, U) != 0)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_masked_heads_contribute_nothing(rng, scaling):
    spec = mh.ClassifierSpec(head_scaling=scaling)
    heads, tokens, dim = 5, 3, 7
    X, W, U, _ = classifier_inputs(rng, spec, heads, tokens, dim)
    mask = np.array([1.0, 0.0, 1.0, 0.0, 0.0])
    W2, U2 = W.copy(), U.copy()
    W2[mask == 0] = 9 * rng.standard_normal(W2[mask == 0].shape)
    U2[mask == 0] = 9 * rng.standard_normal(U2[mask == 0].shape)
    a = mh.classifier_score(X, W, U, spec, head_mask=mask)
    np.testing.assert_allclose(mh.classifier_score(X, W2, U2, spec, head_mask=mask), a, rtol=1e-13)
    # H active heads of the masked model equal a model built with those H heads
    kept = mask == 1
    np.testing.assert_allclose(mh.classifier_score(X, W[kept], U[kept], spec), a, rtol=1e-13)
    assert mh.classifier_score(X, W, U, spec, head_mask=np.zeros(heads)) == 0


def test_head_mask_sweep_shares_one_compilation(rng):
    spec = mh.ClassifierSpec()
    X, W, U, _ = classifier_inputs(rng, spec, 4, 3, 5)
    score = jax.jit(
        chex.assert_max_traces(lambda mask: mh.classifier_score(X, W, U, spec, head_mask=mask), n=1)
    )
    masks = np.tril(np.ones((4, 4)))  # 1, 2, 3, 4 active heads
    got = [score(m) for m in masks]
    want = [mh.classifier_score(X, W[: h + 1], U[: h + 1], spec) for h in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


# ---- transformations ------------------------------------------------------------------


def test_jit_equals_eager_and_does_not_retrace(rng):
    f = jax.jit(chex.assert_max_traces(mh.mha, n=1))
    for _ in range(3):  # new values, same shapes: one trace
        X, theta, W = draw(rng, 3, 5, 7)
        np.testing.assert_allclose(f(X, theta, W), mh.mha(X, theta, W), rtol=1e-13, atol=1e-13)


def test_vmap_equals_python_loop(rng):
    batch = [draw(rng, 3, 5, 7) for _ in range(6)]
    X, theta, W = (np.stack(a) for a in zip(*batch, strict=True))
    out = jax.vmap(mh.mha)(X, theta, W)
    for i in range(6):
        np.testing.assert_allclose(out[i], mh.mha(X[i], theta[i], W[i]), rtol=1e-13, atol=1e-13)
    # samples mapped under a shared teacher
    shared = jax.vmap(mh.mha, in_axes=(0, None, None))(X, theta[0], W[0])
    np.testing.assert_allclose(shared[3], mh.mha(X[3], theta[0], W[0]), rtol=1e-13, atol=1e-13)


def test_classifier_vmap_and_jit(rng):
    spec = mh.ClassifierSpec(query="first", readout="vector")
    X = rng.standard_normal((4, 5, 7))
    _, W, U, _ = classifier_inputs(rng, spec, 3, 5, 7)
    batched = jax.jit(
        jax.vmap(mh.classifier_score, in_axes=(0, None, None, None)), static_argnums=3
    )(X, W, U, spec)
    for i in range(4):
        np.testing.assert_allclose(batched[i], mh.classifier_score(X[i], W, U, spec), rtol=1e-12)


# ---- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "X_shape,theta_shape,W_shape,fragment",
    [
        ((2, 5, 7), (3, 7, 7), (3, 7, 7), "X: expected shape (tokens, dim)"),
        (
            (5, 7),
            (3, 7, 6),
            (3, 7, 7),
            "theta: expected shape (heads, dim, dim) = (3, 7, 7), received (3, 7, 6)",
        ),
        ((5, 7), (7, 7), (3, 7, 7), "received shape (7, 7)"),
        (
            (5, 7),
            (3, 7, 7),
            (2, 7, 7),
            "W: expected shape (heads, dim, dim) = (3, 7, 7), received (2, 7, 7)",
        ),
        (
            (5, 6),
            (3, 7, 7),
            (3, 7, 7),
            "theta: expected shape (heads, dim, dim) = (3, 6, 6), received (3, 7, 7)",
        ),
        ((0, 7), (3, 7, 7), (3, 7, 7), "size >= 1"),
    ],
)
def test_bad_shapes_raise_value_error_naming_shapes(X_shape, theta_shape, W_shape, fragment):
    with pytest.raises(ValueError) as err:
        mh.mha(np.ones(X_shape), np.ones(theta_shape), np.ones(W_shape))
    assert fragment in str(err.value)
    with pytest.raises(ValueError):  # the same check fires at trace time under jit
        jax.jit(mh.mha)(np.ones(X_shape), np.ones(theta_shape), np.ones(W_shape))


def test_classifier_bad_input():
    X, W = np.ones((5, 7)), np.ones((3, 7, 7))
    with pytest.raises(
        ValueError,
        match=r"U: expected shape \(heads, queries, dim\) = \(3, 5, 7\), received \(3, 1, 7\)",
    ):
        mh.classifier_score(X, W, np.ones((3, 1, 7)), mh.ClassifierSpec())
    with pytest.raises(ValueError, match=r"U: expected shape \(heads, dim\)"):
        mh.classifier_score(X, W, np.ones((3, 5, 7)), mh.ClassifierSpec(readout="vector"))
    with pytest.raises(ValueError, match="needs a prompt"):
        mh.classifier_score(
            X, W, np.ones((3, 7)), mh.ClassifierSpec(query="prompt", readout="vector")
        )
    with pytest.raises(
        ValueError, match=r"head_mask: expected shape \(heads\) = \(3\), received \(2,\)"
    ):
        mh.classifier_score(X, W, np.ones((3, 5, 7)), mh.ClassifierSpec(), head_mask=np.ones(2))
    for bad in [
        dict(query="last"),
        dict(readout="tensor"),
        dict(head_scaling="log"),
        dict(temperature=0.0),
        dict(temperature=-1.0),
    ]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            mh.ClassifierSpec(**bad)


def test_saturating_softmax_gradient_keeps_the_selected_entry():
    """Logit gaps of 40–60 (weights below float64's epsilon): the gradient equals the
    pairwise closed form x̄_k = s_k Σ_j s_j (g_k − g_j) (every term a product of small
    weights, no cancellation), where jax.nn.softmax's backward pass loses the largest entry."""
    x = np.array([[0.0, -40.0, -45.0, -60.0], [3.0, 2.0, -50.0, 1.0]])
    g = np.array([[0.3, -1.2, 0.7, 2.0], [1.0, -0.5, 0.25, 2.0]])
    s = np.exp(x - x.max(1, keepdims=True))
    s /= s.sum(1, keepdims=True)
    want = s * np.einsum("rj,rkj->rk", s, g[:, :, None] - g[:, None, :])

    def pulled(softmax):
        return np.asarray(jax.vjp(softmax, jnp.asarray(x))[1](jnp.asarray(g))[0])

    got = pulled(mh.kernels.saturating_softmax)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    plain = pulled(lambda v: jax.nn.softmax(v, axis=-1))
    assert abs(plain[0, 0] - want[0, 0]) > 0.5 * abs(want[0, 0])  # the entry the fix keeps
    np.testing.assert_allclose(plain[1], want[1], rtol=1e-12)  # unsaturated: the same
    np.testing.assert_array_equal(
        mh.kernels.saturating_softmax(jnp.asarray(x)), jax.nn.softmax(jnp.asarray(x), axis=-1)
    )
