"""Collection for the whole project (tests/ and the notebooks nbval runs)."""


def pytest_ignore_collect(collection_path, config):
    """00_quickstart runs cell by cell in a real JupyterLab instead (tests/test_browser.py: every cell, no
    error, its checks passed), so nbval does not run it a second time, wherever Chromium is there for that."""
    if collection_path.name == "00_quickstart.ipynb":
        from lab.plots import find_chrome

        return find_chrome() is not None or None
    return None
