"""The suite's own arrangement on pytest-xdist's workers (tests/conftest.py)."""

import os

import pytest


def test_a_module_and_the_tiny_studies_readers_each_run_whole_on_one_worker(request):
    """pytest-xdist's scheduler keeps a group on one worker only if it finds the group in the
    test's id (``--dist loadgroup``); a group lost on the way (a hook order, a pytest whose ids
    pytest-xdist cannot tag) spreads the tests over both workers, each computing the tiny
    studies again (six minutes each)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("one process (-n 0): no workers to group on")
    if not getattr(request.config.option, "loadgroup", False):  # set on each worker
        pytest.skip("a --dist other than loadgroup: the groups are not read")
    assert request.node.nodeid.endswith("@tests/test_workers.py"), request.node.nodeid
