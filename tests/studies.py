"""Tiny sizes of the built-in studies, shared by the study, store, plot and CLI tests."""

#: Every built-in study at a size that runs in seconds (at least two points on every axis
#: that has a curve, so that plots and reshapes are exercised).
TINY = {
    "recovery": dict(
        learner=("adam", "uniform"),
        samples=(40, 60),
        heads=(1, 2),
        dim=4,
        tokens=3,
        steps=20,
        instances=2,
    ),
    "regimes": dict(beta=(1.0, 4.0), heads=(1, 2), inputs=("boolean",), samples=16, instances=3),
    "heads": dict(
        heads=(1, 2),
        lr=(0.3, 1.0),
        noise=(0.5, 1.0),
        samples=16,
        steps=10,
        instances=2,
        test_samples=16,
    ),
    "stepsize": dict(
        heads=(1, 2),
        lr=(1.0, 1e4),
        samples=16,
        steps=10,
        instances=2,
        power_iterations=5,
        test_samples=16,
    ),
    "samples": dict(samples=(16, 32), heads=(1, 2), steps=10, instances=2, test_samples=16),
    "margin": dict(heads=(1, 2), samples=16, svm_iterations=50, instances=2, test_samples=16),
}
