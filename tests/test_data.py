import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhalearn as mh

KEY = jax.random.key(7)


def within(estimate, truth, std_error, sigmas=6.0):
    assert abs(estimate - truth) <= sigmas * std_error, (estimate, truth, std_error)


def test_boolean_tokens_moments():
    X = np.asarray(mh.boolean_tokens(KEY, (4000, 5, 7)))
    assert X.shape == (4000, 5, 7) and X.dtype == np.float64
    assert set(np.unique(X)) == {-1.0, 1.0}
    n = X.size
    within(X.mean(), 0.0, 1 / np.sqrt(n))
    # entries independent: the empirical correlation of two coordinates is ~0
    within(np.mean(X[..., 0] * X[..., 1]), 0.0, 1 / np.sqrt(X[..., 0].size))
    assert mh.boolean_tokens(KEY, (3,), dtype=jnp.float32).dtype == jnp.float32


def test_gaussian_tokens_moments():
    X = np.asarray(mh.gaussian_tokens(KEY, (4000, 5, 7)))
    n = X.size
    within(X.mean(), 0.0, 1 / np.sqrt(n))
    within(X.var(), 1.0, np.sqrt(2 / n))
    within(np.mean(X**4), 3.0, np.sqrt(96 / n))


def test_sample_tokens_dispatches_and_is_deterministic():
    a = mh.sample_tokens(KEY, "boolean", (2, 3))
    np.testing.assert_array_equal(a, mh.boolean_tokens(KEY, (2, 3)))
    np.testing.assert_array_equal(
        mh.sample_tokens(KEY, "gaussian", (2, 3)), mh.gaussian_tokens(KEY, (2, 3))
    )
    with pytest.raises(ValueError, match="distribution must be one of"):
        mh.sample_tokens(KEY, "uniform", (2, 3))


@pytest.mark.parametrize("shape", [(0, 3), (3, -1), (2.5,)])
def test_token_generators_reject_bad_shapes(shape):
    for gen in (mh.boolean_tokens, mh.gaussian_tokens):
        with pytest.raises(ValueError, match="every size must be an integer >= 1"):
            gen(KEY, shape)


@pytest.mark.parametrize("positions", ["random", "fixed"])
@pytest.mark.parametrize("means", ["orthogonal", "antipodal"])
def test_tokenized_mixture_statistics(positions, means):
    spec = mh.MixtureSpec(
        tokens=8,
        dim=9,
        relevant_fraction=0.3,
        irrelevant_means=3,
        positions=positions,
        means=means,
        signal_norm=2.0,
        irrelevant_norm=1.5,
        noise=0.8,
    )
    n = 6000
    data = mh.tokenized_mixture(KEY, spec, n)
    X, y, rel = (np.asarray(a) for a in (data.X, data.y, data.relevant))
    assert X.shape == (n, 8, 9) and y.shape == (n,) and rel.shape == (n, 8)
    assert set(np.unique(y)) == {-1.0, 1.0}
    within(y.mean(), 0.0, 1 / np.sqrt(n))
    assert spec.n_relevant == 3 and np.all(rel.sum(1) == 3)
    if positions == "fixed":
        assert np.all(rel[:, :3]) and not np.any(rel[:, 3:])
    else:  # every position equally likely to be relevant
        share = rel.mean(0)
        for s in share:
            within(s, 3 / 8, np.sqrt(3 / 8 * 5 / 8 / n))

    sd = 0.8 / np.sqrt(9)
    mu = {
        1.0: np.eye(9)[0] * 2.0,
        -1.0: (-np.eye(9)[0] if means == "antipodal" else np.eye(9)[1]) * 2.0,
    }
    for label in (-1.0, 1.0):
        tokens = X[(y == label)[:, None] & rel]
        np.testing.assert_array_less(
            np.abs(tokens.mean(0) - mu[label]), 6 * sd / np.sqrt(len(tokens))
        )
    # irrelevant tokens: each lies near exactly one ν_j, chosen uniformly
    first = 1 if means == "antipodal" else 2
    nu = 1.5 * np.eye(9)[first : first + 3]
    irr = X[~rel]
    nearest = np.argmin(((irr[:, None, :] - nu[None]) ** 2).sum(-1), axis=1)
    counts = np.bincount(nearest, minlength=3) / len(irr)
    for c in counts:
        within(c, 1 / 3, np.sqrt(2 / 9 / len(irr)))
    noise = irr - nu[nearest]
    within(noise.var(), sd**2, sd**2 * np.sqrt(2 / noise.size))
    within(noise.mean(), 0.0, sd / np.sqrt(noise.size))


def test_mixture_noise_is_a_sweepable_array():
    def noise_var(noise):
        spec = mh.MixtureSpec(
            tokens=4,
            dim=4,
            relevant_fraction=1.0,
            irrelevant_means=0,
            means="antipodal",
            noise=noise,
        )
        d = mh.tokenized_mixture(KEY, spec, 2000)
        signal = spec.label_means()[((d.y + 1) // 2).astype(int)]
        return jnp.var(d.X - signal[:, None, :])

    var = jax.jit(jax.vmap(noise_var))(jnp.array([0.0, 1.0, 2.0]))
    np.testing.assert_allclose(var, np.array([0.0, 1.0, 4.0]) / 4, rtol=0.1, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        (dict(tokens=0, dim=4), "tokens must be an integer >= 1"),
        (dict(tokens=4, dim=-2), "dim must be an integer >= 1"),
        (dict(tokens=4, dim=4, relevant_fraction=0.0), "relevant_fraction must lie in"),
        (dict(tokens=4, dim=4, relevant_fraction=1.5), "relevant_fraction must lie in"),
        (dict(tokens=4, dim=3, irrelevant_means=2), "dim must be >= 4"),
        (dict(tokens=4, dim=4, irrelevant_means=0), "irrelevant_means must be >= 1"),
        (dict(tokens=4, dim=4, noise=-1.0), "noise must lie in"),
        (dict(tokens=4, dim=4, positions="middle"), "positions must be one of"),
    ],
)
def test_mixture_spec_validation(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        mh.MixtureSpec(**kwargs)
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        mh.tokenized_mixture(KEY, mh.MixtureSpec(tokens=4, dim=4), 0)


@pytest.mark.parametrize("positions", ["random", "fixed"])
def test_decoys_carry_the_other_label_mean_and_cancel_it_in_the_average(positions):
    spec = mh.MixtureSpec(
        tokens=6,
        dim=6,
        relevant_fraction=0.3,
        decoys=2,
        irrelevant_means=2,
        positions=positions,
        noise=0.2,
    )
    n = 6000
    data = mh.tokenized_mixture(KEY, spec, n)
    X, y, rel = (np.asarray(a) for a in (data.X, data.y, data.relevant))
    mu = {1.0: np.eye(6)[0], -1.0: np.eye(6)[1]}
    sd = 0.2 / np.sqrt(6)
    # decoys: the two tokens nearest μ_{−y} among the non-relevant ones, at positions 2, 3 if fixed
    for label in (-1.0, 1.0):
        rows = X[y == label]
        near_other = np.linalg.norm(rows - mu[-label], axis=-1) < 0.5
        np.testing.assert_array_equal(near_other.sum(1), 2)
        assert not np.any(near_other & rel[y == label])
        if positions == "fixed":
            assert np.all(near_other[:, 2:4]) and not np.any(near_other[:, [0, 1, 4, 5]])
        else:
            for s in near_other.mean(0):
                within(s, 2 / 6, np.sqrt(2 / 6 * 4 / 6 / len(rows)))
        decoy_tokens = rows[near_other]
        np.testing.assert_array_less(
            np.abs(decoy_tokens.mean(0) - mu[-label]), 6 * sd / np.sqrt(len(decoy_tokens))
        )
    # the token average has the same mean under both labels (here n_R = decoys = 2)
    average = X.mean(1)
    gap = average[y == 1].mean(0) - average[y == -1].mean(0)
    np.testing.assert_array_less(np.abs(gap), 6 * 0.5 / np.sqrt(n))
    # while the relevant tokens carry the label: their means differ by μ_+ − μ_-
    lead = X[:, 0] if positions == "fixed" else X[rel].reshape(n, 2, 6)[:, 0]
    np.testing.assert_allclose(
        lead[y == 1].mean(0) - lead[y == -1].mean(0), mu[1.0] - mu[-1.0], atol=0.05
    )


def test_decoys_are_validated():
    with pytest.raises(ValueError, match="decoys must be <= tokens - n_relevant = 3"):
        mh.MixtureSpec(tokens=4, dim=4, decoys=4)
    with pytest.raises(ValueError, match="decoys must be an integer >= 0"):
        mh.MixtureSpec(tokens=4, dim=4, decoys=-1)
    # every position relevant or decoy: no irrelevant mean needed
    mh.MixtureSpec(tokens=4, dim=4, relevant_fraction=0.5, decoys=2, irrelevant_means=0)
