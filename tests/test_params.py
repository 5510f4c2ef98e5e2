import jax
import numpy as np
import pytest

import mhalearn as mh


def test_layer_params_checks_shapes():
    p = mh.LayerParams(theta=np.zeros((3, 7, 7)), W=np.ones((3, 7, 7)))
    assert (p.heads, p.dim) == (3, 7)
    with pytest.raises(
        ValueError,
        match=r"theta: expected shape \(heads, dim, dim\) = \(3, 7, 7\), received \(3, 7, 5\)",
    ):
        mh.LayerParams(theta=np.zeros((3, 7, 5)), W=np.ones((3, 7, 7)))
    with pytest.raises(
        ValueError,
        match=r"W: expected shape \(heads, dim, dim\) = \(3, 7, 7\), received \(2, 7, 7\)",
    ):
        mh.LayerParams(theta=np.zeros((3, 7, 7)), W=np.ones((2, 7, 7)))
    with pytest.raises(ValueError, match=r"rank 3\), received shape \(7, 7\)"):
        mh.LayerParams(theta=np.zeros((7, 7)), W=np.ones((7, 7)))


def test_classifier_params_checks_shapes():
    W = np.zeros((3, 5, 5))
    assert mh.ClassifierParams(W=W, U=np.ones((3, 4, 5))).heads == 3
    assert mh.ClassifierParams(W=W, U=np.ones((3, 5)), prompt=np.ones(5)).dim == 5
    with pytest.raises(
        ValueError, match=r"U: expected shape \(heads, dim\) = \(3, 5\), received \(2, 5\)"
    ):
        mh.ClassifierParams(W=W, U=np.ones((2, 5)))
    with pytest.raises(ValueError, match=r"U: expected shape \(heads, queries, dim\)"):
        mh.ClassifierParams(W=W, U=np.ones((3, 4, 6)))
    with pytest.raises(
        ValueError, match=r"prompt: expected shape \(dim\) = \(5\), received \(4,\)"
    ):
        mh.ClassifierParams(W=W, U=np.ones((3, 5)), prompt=np.ones(4))


def test_params_are_pytrees_that_vmap():
    def make(scale):
        return mh.LayerParams(theta=scale * np.ones((2, 3, 3)), W=np.ones((2, 3, 3)))

    stacked = jax.vmap(make)(np.arange(4.0))
    assert stacked.theta.shape == (4, 2, 3, 3)
    leaves = jax.tree_util.tree_leaves(mh.ClassifierParams(W=np.ones((2, 3, 3)), U=np.ones((2, 3))))
    assert len(leaves) == 2  # prompt=None is no leaf
