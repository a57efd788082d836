"""JupyterLab in a real browser: started as `make lab` starts it, driven through its UI with Playwright and
Debian's Chromium. Notebook 00 runs every cell without an error; so does each lesson with a widget (01, 04, 05,
08, 20), and its widget still works there: a slider moved redraws its output, 20's pasted prompts are audited
(nbval leaves these notebooks to this test where Chromium exists: see the root conftest.py).
Nothing here waits a fixed time: each step waits for the state it needs (the kernel idle, execution
started, every cell run, the file saved with its outputs). Screenshots go to LAB_SCREENSHOTS_DIR (default:
the test's own temporary folder)."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from lab.experiments.plots import find_chrome
from lab.tools.notebook_server import JupyterLab
from lab.tools.runner import NOTEBOOKS_DIR

CHROMIUM = find_chrome()  # BROWSER_PATH, or chromium / chrome on the PATH
pytestmark = [pytest.mark.engine,  # JupyterLab and a kernel running the lessons
              pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")]
IN_BROWSER = ("00_quickstart.ipynb", "01_block_hashing.ipynb", "04_block_size_sweep.ipynb",
              "05_cache_on_vs_off.ipynb", "08_eviction.ipynb", "20_your_workload.ipynb")

# the notebook in front: other tabs stay in the page, hidden
ACTIVE = ".jp-NotebookPanel:not(.lm-mod-hidden)"
PROMPTS = f"[...document.querySelectorAll('{ACTIVE} .jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim())"
ALL_CELLS_RAN = f"() => {{ const p = {PROMPTS}; return p.length > 0 && p.every(t => /^\\[\\d+\\]:$/.test(t)); }}"
STARTED = f"() => {PROMPTS}.some(t => /^\\[(\\*|\\d+)\\]:$/.test(t))"
ERRORS_SHOWN = (f"() => [...document.querySelectorAll('{ACTIVE} .jp-OutputArea-output"
                "[data-mime-type=\"application/vnd.jupyter.stderr\"]')].map(o => o.textContent)"
                ".filter(t => /Traceback|\\w+Error\\b/.test(t))")


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    path = Path(os.environ.get("LAB_SCREENSHOTS_DIR") or tmp_path_factory.mktemp("screenshots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """JupyterLab on copies of the notebooks (its autosave must not write outputs into the committed ones)."""
    root = tmp_path_factory.mktemp("notebooks")
    for name in IN_BROWSER:
        shutil.copy(NOTEBOOKS_DIR / name, root / name)
    settings = {"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}  # every cell in the page
    with JupyterLab(root=root, settings=settings) as lab:
        yield lab, root


@pytest.fixture(scope="module")
def page(jupyterlab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--disable-background-networking", "--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)  # no click or lookup waits longer than a minute
        yield page
        browser.close()


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def kernel_idle(lab: JupyterLab) -> bool:
    """A kernel is idle; while one is still starting, JupyterLab's kernel list can answer 500: not yet."""
    import urllib.error

    try:
        return any(k["execution_state"] == "idle" for k in lab.kernels())
    except urllib.error.HTTPError:
        return False


def run_all_cells(page, lab: JupyterLab, notebook: str, screenshots: Path, timeout_s: float = 300) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    # each notebook alone in a fresh workspace: a tab restored from the visit before would take the Run menu
    page.goto(lab.url(notebook, workspace=Path(notebook).stem.replace("_", "-")))
    page.wait_for_selector(f"{ACTIVE} .jp-CodeCell", timeout=60_000)
    assert page.locator(".jp-NotebookPanel").count() == 1, "one notebook open, the one to run"
    page.locator(f"{ACTIVE} .jp-CodeCell").first.click()  # the notebook has the focus the Run menu acts on
    wait_for(lambda: kernel_idle(lab), 120, "the notebook's kernel to be idle")
    page.wait_for_selector("text=Idle >> visible=true", timeout=60_000)  # and the page knows it
    for attempt in range(3):
        page.locator(".lm-MenuBar-item", has_text="Run").click()
        page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
        try:  # execution started: a prompt shows [*] or a number
            page.wait_for_function(STARTED, timeout=30_000, polling=500)
            break
        except PlaywrightTimeout:  # the menu was opened while the page still settled: close it and try again
            page.keyboard.press("Escape")
            page.screenshot(path=str(screenshots / f"{Path(notebook).stem}-not-started-{attempt}.png"))
    else:
        raise AssertionError(f"Run All Cells never started on {notebook}")
    try:
        page.wait_for_function(ALL_CELLS_RAN, timeout=timeout_s * 1000, polling=1000)
    finally:
        page.screenshot(path=str(screenshots / f"{Path(notebook).stem}-last.png"), full_page=True)


def saved_outputs(page, root: Path, notebook: str) -> list[dict]:
    """Save (Ctrl+S) and read the outputs back from the file, once the save has written them."""
    path = root / notebook
    before = path.stat().st_mtime_ns
    page.keyboard.press("Control+s")

    def written():
        if path.stat().st_mtime_ns == before:
            return None
        try:
            cells = json.loads(path.read_text())["cells"]
        except json.JSONDecodeError:  # caught mid-write
            return None
        return [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])] or None

    return wait_for(written, 30, f"{notebook} to be saved with its outputs")


def test_quickstart_runs_every_cell_in_jupyterlab_without_an_error(jupyterlab, page, screenshots):
    lab, root = jupyterlab
    run_all_cells(page, lab, "00_quickstart.ipynb", screenshots)
    page.screenshot(path=str(screenshots / "00_quickstart.png"), full_page=True)
    assert page.evaluate(ERRORS_SHOWN) == [], "a cell shows an error"
    outputs = saved_outputs(page, root, "00_quickstart.ipynb")
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("all checks passed" in "".join(o.get("text", "")) for o in outputs), "the last cell's checks ran"


def test_block_hashing_runs_and_its_widget_redraws_the_block_map(jupyterlab, page, screenshots):
    lab, root = jupyterlab
    run_all_cells(page, lab, "01_block_hashing.ipynb", screenshots)
    widget = page.locator(f"{ACTIVE} .widget-interact").last
    widget.scroll_into_view_if_needed()
    block_map = widget.locator(".widget-output")
    before = block_map.inner_html()
    page.screenshot(path=str(screenshots / "01_block_hashing-before.png"))
    handle = widget.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("([el, old]) => el.innerHTML !== old", arg=[block_map.element_handle(), before], timeout=30_000)
    page.screenshot(path=str(screenshots / "01_block_hashing-after.png"))
    assert block_map.inner_html() != before and "block" in block_map.inner_text().lower()
    assert page.evaluate(ERRORS_SHOWN) == [], "a cell shows an error"
    outputs = saved_outputs(page, root, "01_block_hashing.ipynb")
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("all checks passed" in "".join(o.get("text", "")) for o in outputs), "the notebook's checks ran"


def run_with_its_checks(page, lab, root: Path, notebook: str, screenshots: Path) -> None:
    """Every cell of `notebook` run in JupyterLab: no error shown or saved, and its checks passed."""
    run_all_cells(page, lab, notebook, screenshots)
    assert page.evaluate(ERRORS_SHOWN) == [], "a cell shows an error"
    outputs = saved_outputs(page, root, notebook)
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("all checks passed" in "".join(o.get("text", "")) for o in outputs), "the notebook's checks ran"


@pytest.mark.parametrize("notebook, shown", [("04_block_size_sweep.ipynb", "token hit rate"),
                                             ("05_cache_on_vs_off.ipynb", "best possible prefill speed-up"),
                                             ("08_eviction.ipynb", "token hit rate")])
def test_a_lessons_slider_redraws_its_output_in_jupyterlab(jupyterlab, page, screenshots, notebook, shown):
    lab, root = jupyterlab
    run_with_its_checks(page, lab, root, notebook, screenshots)
    widget = page.locator(f"{ACTIVE} .widget-interact").last
    widget.scroll_into_view_if_needed()
    output = widget.locator(".widget-output")
    page.wait_for_function("el => el.innerText.trim() !== ''", arg=output.element_handle(), timeout=30_000)
    before = output.inner_text()
    widget.locator(".noUi-handle").last.focus()  # the slider (04's first control is the workload's dropdown)
    page.keyboard.press("ArrowRight")
    page.wait_for_function("([el, old]) => el.innerText !== old", arg=[output.element_handle(), before],
                           timeout=30_000)
    page.screenshot(path=str(screenshots / f"{Path(notebook).stem}-slider.png"))
    assert output.inner_text() != before and shown in output.inner_text()


def test_your_workloads_widget_audits_pasted_prompts_in_jupyterlab(jupyterlab, page, screenshots):
    lab, root = jupyterlab
    run_with_its_checks(page, lab, root, "20_your_workload.ipynb", screenshots)
    pasted = "\n".join(json.dumps({"prompt": f"You are a support bot for Acme. Be brief. Customer {i}: where is my "
                                                f"order {1000 + i}?"}) for i in range(6))
    page.locator(f"{ACTIVE} .widget-textarea textarea").last.fill(pasted)
    page.locator(f"{ACTIVE} .widget-button", has_text="Audit").last.click()
    shown = page.locator(f"{ACTIVE} .widget-vbox .widget-output").last
    page.wait_for_function("el => el.innerText.includes('report:')", arg=shown.element_handle(), timeout=120_000)
    page.screenshot(path=str(screenshots / "20_your_workload-audit.png"))
    assert "yours.jsonl: 6 prompts" in shown.inner_text(), "the six pasted prompts were audited"
