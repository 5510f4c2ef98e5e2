"""The small factorisations of mhalearn.solvers: the forms an accelerator runs under ``vmap``
against LAPACK (numpy, float64), and the GPU programs of the package's workloads, lowered for
CUDA on this CPU-only machine, against jaxlib's rules for which cuSOLVER calls take a batch
at once."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import mhalearn as mh
from mhalearn import solvers, teachers
from mhalearn.simulate import _fit_and_score, instance_keys

SHAPES = [(256, 4), (4, 256), (9, 4), (4, 9), (40, 40), (40, 1)]


def _matrix(shape, seed=0):
    return np.array(jax.random.normal(jax.random.key(seed), shape), dtype=np.float64)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(256, 4), (9, 4), (5, 5), (6, 1)])
def test_householder_qr_is_lapacks_factorisation(shape):
    a = _matrix(shape)
    q, r = solvers.householder_qr(jnp.asarray(a))
    q_ref, r_ref = np.linalg.qr(a)  # LAPACK's geqrf/orgqr: the same reflections, signs
    np.testing.assert_allclose(q, q_ref, atol=1e-13)
    np.testing.assert_allclose(r, r_ref, atol=1e-12)
    assert np.all(np.tril(np.asarray(r), -1) == 0)


@pytest.mark.parametrize(
    "damage",
    ["zero column", "repeated column", "zero matrix", "already triangular"],
)
def test_householder_qr_of_degenerate_matrices_stays_orthonormal(damage):
    a = _matrix((12, 4))
    if damage == "zero column":
        a[:, 2] = 0
    elif damage == "repeated column":
        a[:, 3] = 2 * a[:, 0]
    elif damage == "zero matrix":
        a[:] = 0
    else:
        a = np.triu(a)
    q, r = map(np.asarray, solvers.householder_qr(jnp.asarray(a)))
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-14)
    np.testing.assert_allclose(q @ r, a, atol=1e-13)
    if damage == "zero matrix":  # nothing to reflect: LAPACK's Q is the identity's columns
        np.testing.assert_array_equal(q, np.eye(12, 4))


@pytest.mark.parametrize(
    "dtype, size", [(np.float64, 1e200), (np.float64, 1e-200), (np.float32, 1e25)]
)
def test_householder_qr_neither_overflows_nor_underflows(dtype, size):
    """Entries whose squares leave the floating-point range: factored as LAPACK does."""
    a = (_matrix((9, 3)) * size).astype(dtype)
    q, r = map(np.asarray, solvers.householder_qr(jnp.asarray(a)))
    assert np.all(np.isfinite(q)) and np.all(np.isfinite(r))
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(q.T @ q, np.eye(3), atol=20 * eps)
    np.testing.assert_allclose(q @ r / size, a / size, atol=20 * eps)


def _svd_check(u, s, vt, a):
    k = min(a.shape)
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose((u * s) @ vt, a, atol=1e-12)
    np.testing.assert_allclose(u.T @ u, np.eye(k), atol=1e-13)
    np.testing.assert_allclose(vt @ vt.T, np.eye(k), atol=1e-13)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_accelerator_forms_compute_lapacks_quantities(shape):
    """Each accelerator form, run here on CPU under vmap, against numpy's LAPACK in float64."""
    a = np.stack([_matrix(shape, seed) for seed in range(3)])
    b = np.stack([_matrix(shape[:1], 10 + seed) for seed in range(3)])
    sv = np.asarray(jax.vmap(solvers._singular_values_batched)(a))
    norm = np.asarray(jax.vmap(solvers._spectral_norm_batched)(a))
    u, s, vt = map(np.asarray, jax.vmap(solvers._svd_batched)(a))
    x = np.asarray(jax.vmap(solvers._least_squares_batched)(a, b))
    for i in range(len(a)):
        ref = np.linalg.svd(a[i], compute_uv=False)
        np.testing.assert_allclose(sv[i], ref, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(norm[i], ref[0], rtol=1e-13)
        _svd_check(u[i], s[i], vt[i], a[i])
        np.testing.assert_allclose(x[i], np.linalg.lstsq(a[i], b[i], rcond=None)[0], atol=1e-11)
    if shape[0] >= shape[1]:
        q = np.asarray(jax.vmap(solvers._orthonormal_basis_batched)(a))
        for i in range(len(a)):
            q_ref = np.linalg.qr(a[i])[0]
            np.testing.assert_allclose(q[i] @ q[i].T, q_ref @ q_ref.T, atol=1e-13)  # one span


def test_least_squares_accelerator_form_is_the_minimum_norm_solution():
    """Rank-deficient systems: numpy's minimum-norm solution, not any least-squares one."""
    a = _matrix((30, 4))
    a[:, 3] = a[:, 0] - a[:, 1]
    b = _matrix((30,), 1)
    x = np.asarray(solvers._least_squares_batched(jnp.asarray(a), jnp.asarray(b)))
    np.testing.assert_allclose(x, np.linalg.lstsq(a, b, rcond=None)[0], atol=1e-12)


# --- the GPU programs, lowered for CUDA without a GPU ---------------------------------------

#: jaxlib's cuSOLVER targets and when each takes a batch of matrices as one call (else it loops
#: over the batch on the host, one library call per matrix), from its CUDA kernels' dispatch
#: (jaxlib/gpu/solver_kernels_ffi.cc): Householder QR batched through cuBLAS for small
#: matrices per batch entry, LU likewise for square ones, the Jacobi eigensolver for sides up
#: to 32, the Jacobi SVD for sides up to 32 with full matrices; Q from the reflections, the QR
#: SVD and the tridiagonal reduction always loop. Targets not named here (Cholesky, pivots)
#: are not judged.
BATCHED_WHEN = {
    "cusolver_geqrf_ffi": lambda b, m, n, attrs: m // b <= 128 and n // b <= 128,
    "cusolver_getrf_ffi": lambda b, m, n, attrs: m == n and m // b <= 128,
    "cusolver_syevd_ffi": lambda b, m, n, attrs: n <= 32,
    "cusolver_gesvdj_ffi": lambda b, m, n, attrs: (
        m <= 32 and n <= 32 and "full_matrices = true" in attrs
    ),
    "cusolver_gesvd_ffi": lambda b, m, n, attrs: False,
    "cusolver_orgqr_ffi": lambda b, m, n, attrs: False,
    "cusolver_sytrd_ffi": lambda b, m, n, attrs: False,
}

CALL = re.compile(
    r"custom_call @(\w+)\((?:[^()]|\([^()]*\))*\)\s*(\{[^\n]*?\})?\s*:\s*\(tensor<([^>]*)>"
)


def per_matrix_calls(fn, *shapes) -> list[str]:
    """The solver calls of ``jit(fn)`` lowered for CUDA that jaxlib makes one matrix at a
    time over a batch of more than one matrix, as ``target batch×m×n``."""
    text = export.export(jax.jit(fn), platforms=["cuda"])(*shapes).mlir_module()
    looped = []
    for target, attrs, tensor in CALL.findall(text):
        if target not in BATCHED_WHEN:
            continue
        dims = [int(d) for d in tensor.split("x")[:-1]]
        batch, (m, n) = math.prod(dims[:-2]), dims[-2:]
        if batch > 1 and not BATCHED_WHEN[target](batch, m, n, attrs or ""):
            looped.append(f"{target} {batch}×{m}×{n}")
    return looped


def test_the_inventory_sees_jnp_linalgs_per_matrix_calls():
    """The check below can fail: jnp.linalg's own calls at these shapes are looped on a GPU."""
    tall = jax.ShapeDtypeStruct((512, 256, 4), jnp.float32)
    assert per_matrix_calls(jax.vmap(lambda a: jnp.linalg.qr(a)[0]), tall) == [
        "cusolver_orgqr_ffi 512×256×4"
    ]
    assert per_matrix_calls(jax.vmap(lambda a: jnp.linalg.svd(a, compute_uv=False)), tall)
    square = jax.ShapeDtypeStruct((512, 16, 16), jnp.float32)
    assert per_matrix_calls(jax.vmap(lambda a: jnp.linalg.svd(a, compute_uv=False)), square) == []


@pytest.mark.parametrize("shape", [(256, 4), (4, 256), (9, 4), (16, 16)])
def test_solvers_make_no_per_matrix_gpu_call(shape):
    a = jax.ShapeDtypeStruct((512, *shape), jnp.float32)
    b = jax.ShapeDtypeStruct((512, shape[0]), jnp.float32)
    for name in ("singular_values", "svd", "spectral_norm"):
        assert per_matrix_calls(jax.vmap(getattr(solvers, name)), a) == [], name
    assert per_matrix_calls(jax.vmap(solvers.least_squares), a, b) == []
    if shape[0] >= shape[1]:  # a basis of a tall matrix's columns
        assert per_matrix_calls(jax.vmap(solvers.orthonormal_basis), a) == []


WORKLOADS = {
    "full-batch GD, standard shape": (
        mh.RegressionTask(
            teacher=mh.TeacherSpec(heads=4, dim=16, tokens=8), samples=512, test_samples=16
        ),
        mh.GDConfig(optimizer="gd", steps=3, lr=0.05, snapshots=2),
    ),
    "variable projection, recovery shape": (
        mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=8, tokens=4), samples=1000),
        mh.VarProConfig(iterations=3, restarts=2),
    ),
}


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_gpu_programs_make_no_per_matrix_solver_call(name, monkeypatch):
    """An instance of simulate (draw with its rejection loop and checks, fit, score), vmapped
    over 1024 instances as the engine's group program on a GPU, lowered for CUDA: every
    solver call takes the batch at once."""
    # as on an accelerator: the first draws of a teacher made side by side
    monkeypatch.setitem(teachers.CANDIDATES, jax.default_backend(), 4)
    task, learner = WORKLOADS[name]
    spec = {"task": task, "learner": learner}
    keys = jax.ShapeDtypeStruct((1024,), jax.random.key(0).dtype)
    fn = jax.vmap(lambda k: _fit_and_score(instance_keys(k), spec))
    assert per_matrix_calls(fn, keys) == []


def _subjaxprs(eqn):
    """The jaxprs inside one equation (loop bodies, branches, nested calls)."""
    for value in eqn.params.values():
        for v in value if isinstance(value, tuple | list) else (value,):
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jax.extend.core.Jaxpr):
                yield v


def per_step_while_loops(fn, *args) -> list[str]:
    """The while loops of ``fn``'s program whose body runs no fixed-length scan: a loop that
    asks the host whether to go on after every step of work, rather than once per block."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "while":
                body = eqn.params["body_jaxpr"].jaxpr
                blocks = [e for e in body.eqns if e.primitive.name == "scan"]
                if not any(e.params["length"] > 1 for e in blocks):
                    found.append(f"while with body of {len(body.eqns)} equations")
            for sub in _subjaxprs(eqn):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


@pytest.mark.parametrize("optimizer, batch_size", [("gd", None), ("adam", 16)])
def test_gd_fits_test_for_stopping_once_per_block_not_per_step(optimizer, batch_size):
    task = mh.RegressionTask(teacher=mh.TeacherSpec(heads=2, dim=4, tokens=3), samples=64)
    config = mh.GDConfig(optimizer=optimizer, steps=50, tol=1e-6, batch_size=batch_size)
    keys = jax.random.split(jax.random.key(0), 8)
    problems = jax.vmap(lambda k: task.sample(k).problem)(keys)
    fit = jax.vmap(lambda k, p: config.fit(k, p))
    assert per_step_while_loops(fit, keys, problems) == []

    # the check can fail: a step loop of the plain kind is seen
    def stepwise(key, problem):
        def body(state):
            t, params = state
            _, grads = problem.loss_and_grad(params)
            return t + 1, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

        start = config.start(key, problem)
        return jax.lax.while_loop(lambda s: s[0] < 50, body, (0, start))[1]

    assert len(per_step_while_loops(jax.vmap(stepwise), keys, problems)) == 1
