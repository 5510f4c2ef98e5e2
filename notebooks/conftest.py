"""The notebooks as tests (``pytest --nbmake notebooks``, at their small size).

pytest-xdist's two workers take the notebooks in the order they are collected; the two that
take longest start first, one on each worker, so that both workers end close together.
Alphabetically, notebook 09 (about 400 s of the twelve's 930 s on CI's two cores) started
after a third of the run and alone set its end.
"""

#: the notebooks that take longest at their small size, longest first
LONGEST = ("09_phase_diagrams.ipynb", "03_certify_and_sculpt.ipynb")


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return LONGEST.index(name) if name in LONGEST else len(LONGEST)

    items.sort(key=rank)  # stable: the others keep their order
