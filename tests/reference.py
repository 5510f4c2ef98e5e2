"""Slow, obviously-correct references: explicit Python loops in float64."""

from __future__ import annotations

import math

import numpy as np


def softmax_row(scores: list[float]) -> list[float]:
    top = max(scores)
    e = [math.exp(s - top) for s in scores]
    total = sum(e)
    return [v / total for v in e]


def attention(queries, keys, theta, temperature=1.0) -> np.ndarray:
    """A[h, q, k] = softmax_k(temperature * Σ_ab queries[q,a] θ[h,a,b] keys[k,b])."""
    queries, keys, theta = (np.asarray(a, np.float64) for a in (queries, keys, theta))
    heads, dim = theta.shape[0], theta.shape[1]
    out = np.zeros((heads, len(queries), len(keys)))
    for h in range(heads):
        for q in range(len(queries)):
            scores = []
            for k in range(len(keys)):
                s = 0.0
                for a in range(dim):
                    for b in range(dim):
                        s += queries[q, a] * theta[h, a, b] * keys[k, b]
                scores.append(temperature * s)
            out[h, q] = softmax_row(scores)
    return out


def mha(X, theta, W) -> np.ndarray:
    """F(X)[t, e] = Σ_h Σ_k A[h,t,k] Σ_d X[k,d] W[h,d,e]."""
    X, W = np.asarray(X, np.float64), np.asarray(W, np.float64)
    A = attention(X, X, theta)
    tokens, dim = X.shape
    out = np.zeros((tokens, W.shape[2]))
    for h in range(W.shape[0]):
        for t in range(tokens):
            for k in range(tokens):
                for d in range(dim):
                    for e in range(W.shape[2]):
                        out[t, e] += A[h, t, k] * X[k, d] * W[h, d, e]
    return out


def classifier_score(
    X, W, U, query, readout, scaling, temperature, prompt=None, mask=None, query_token=None
):
    X = np.asarray(X, np.float64)
    heads = W.shape[0]
    mask = np.ones(heads) if mask is None else np.asarray(mask, np.float64)
    queries = {
        "all": X,
        "first": X[:1],
        "prompt": None if prompt is None else np.asarray(prompt)[None],
        "given": None if query_token is None else np.asarray(query_token)[None],
    }[query]
    A = attention(queries, X, W, temperature)
    total = 0.0
    for h in range(heads):
        if mask[h] == 0:
            continue
        for q in range(len(queries)):
            for k in range(X.shape[0]):
                for d in range(X.shape[1]):
                    u = U[h, q, d] if readout == "matrix" else U[h, d]
                    total += mask[h] * u * A[h, q, k] * X[k, d]
    active = max(mask.sum(), 1.0)
    alpha = {"sqrt": 1 / math.sqrt(active), "mean": 1 / active, "sum": 1.0}[scaling]
    return alpha * total
