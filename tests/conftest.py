"""Test-wide fixtures (the scratch folders for figures and results are set in the root conftest.py)."""

import pytest


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


@pytest.fixture
def on_backend(monkeypatch):
    """`on_backend("cpu")`: the lab behaves as on that back-end (LAB_BACKEND) for the rest of the test."""
    from lab.serving.backend import backend

    def set_backend(name):
        monkeypatch.setenv("LAB_BACKEND", name)
        backend.cache_clear()

    yield set_backend
    backend.cache_clear()

