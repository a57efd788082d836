"""Test-wide fixtures and the `engine` marker (the scratch folders for figures and results are set in the root
conftest.py).

`make test-fast` runs what needs no engine: every test is marked `engine` that starts vLLM, a server, the
router, JupyterLab or a notebook kernel, through the `engines` fixture (found here) or its own
`@pytest.mark.engine` (a module's `pytestmark` where every test in it does). nbval's notebook cells are marked
in the root conftest.py.
"""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "engines" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def engines():
    """`engines(**make_llm_kwargs)`: a live engine with those settings, reused across tests and started
    again when a newer engine closed it (one in-process engine at a time)."""
    started = {}

    def get(**kwargs):
        from lab.serving.engine import is_closed, make_llm

        key = tuple(sorted(kwargs.items()))
        if key not in started or is_closed(started[key]):
            started[key] = make_llm(**kwargs)
        return started[key]

    return get


STANDARD_ENGINE = {"block_size": 32}  # what most engine tests use: one engine per worker serves them all


@pytest.fixture
def standard_engine() -> dict:
    return dict(STANDARD_ENGINE)


@pytest.fixture
def llm(engines):
    """The standard engine (block size 32, caching on), shared by every test that uses it."""
    return engines(**STANDARD_ENGINE)


@pytest.fixture
def on_backend(monkeypatch):
    """`on_backend("cpu")`: the lab behaves as on that back-end (LAB_BACKEND) for the rest of the test."""
    from lab.serving.backend import backend

    def set_backend(name):
        monkeypatch.setenv("LAB_BACKEND", name)
        backend.cache_clear()

    yield set_backend
    backend.cache_clear()

