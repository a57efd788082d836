"""JupyterLab in a real browser: started as `make lab` starts it, driven through its UI with Playwright and
Debian's Chromium. Notebook 00 runs every cell without an error; notebook 02's widget redraws the block map.
Screenshots go to LAB_SCREENSHOTS_DIR (default: the test's own temporary folder)."""

import json
import os
import shutil
from pathlib import Path

import pytest

from lab.notebook_server import JupyterLab
from lab.runner import NOTEBOOKS_DIR

CHROMIUM = os.environ.get("BROWSER_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason="needs Chromium (Debian: apt-get install chromium)")

ALL_CELLS_RAN = """() => {
    const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
    return prompts.length > 0 && prompts.every(p => /^\\[\\d+\\]:$/.test(p));
}"""
ERRORS_SHOWN = """() => [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
    .map(o => o.textContent).filter(t => /Traceback|\\w+Error\\b/.test(t))"""


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    path = Path(os.environ.get("LAB_SCREENSHOTS_DIR") or tmp_path_factory.mktemp("screenshots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab on copies of the notebooks (its autosave must not write outputs into the committed ones)."""
    root = tmp_path_factory.mktemp("notebooks")
    for name in ("00_quickstart.ipynb", "02_block_hashing.ipynb"):
        shutil.copy(NOTEBOOKS_DIR / name, root / name)
    with JupyterLab(root=root) as lab:
        yield lab, root


@pytest.fixture(scope="module")
def page(jupyterlab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--disable-background-networking", "--no-sandbox", "--disable-dev-shm-usage"])
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


def run_all_cells(page, lab: JupyterLab, notebook: str, timeout_s: float = 600) -> None:
    page.goto(lab.url(notebook))
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=60_000)
    page.wait_for_selector("text=Idle", timeout=120_000)  # the kernel has started
    page.locator(".lm-MenuBar-item", has_text="Run").click()
    page.locator(".lm-Menu-item", has_text="Run All Cells").click()
    page.wait_for_function(ALL_CELLS_RAN, timeout=timeout_s * 1000, polling=1000)


def saved_outputs(page, root: Path, notebook: str) -> list[dict]:
    page.keyboard.press("Control+s")
    page.wait_for_timeout(1500)
    nb = json.loads((root / notebook).read_text())
    return [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]


def test_quickstart_runs_every_cell_in_jupyterlab_without_an_error(jupyterlab, page, screenshots):
    lab, root = jupyterlab
    run_all_cells(page, lab, "00_quickstart.ipynb")
    page.screenshot(path=str(screenshots / "00_quickstart.png"), full_page=True)
    assert page.evaluate(ERRORS_SHOWN) == [], "a cell shows an error"
    outputs = saved_outputs(page, root, "00_quickstart.ipynb")
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("all checks passed" in "".join(o.get("text", "")) for o in outputs), "the last cell's checks ran"


def test_the_block_map_widget_redraws_when_the_block_size_moves(jupyterlab, page, screenshots):
    lab, root = jupyterlab
    run_all_cells(page, lab, "02_block_hashing.ipynb")
    widget = page.locator(".widget-interact").last
    widget.scroll_into_view_if_needed()
    block_map = widget.locator(".widget-output")
    before = block_map.inner_html()
    page.screenshot(path=str(screenshots / "02_block_hashing-before.png"))
    handle = widget.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("([el, old]) => el.innerHTML !== old", arg=[block_map.element_handle(), before], timeout=30_000)
    page.screenshot(path=str(screenshots / "02_block_hashing-after.png"))
    assert block_map.inner_html() != before and "block" in block_map.inner_text().lower()
