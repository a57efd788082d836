"""`make book`: the executed lessons as a static site, built offline, opened in Chromium: pages render, figures show,
links between pages resolve, search finds a term."""

import functools
import http.server
import threading

import pytest

from lab.experiments.plots import find_chrome
from lab.tools import book

CHROMIUM = find_chrome()
pytestmark = [pytest.mark.engine,  # a browser (and MkDocs in its own environment)
              pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)"),
              pytest.mark.skipif(not book.MKDOCS.is_file(), reason="needs .venv-book: make book installs it")]


def test_the_site_links_lessons_and_docs_as_pages():
    assert book.site_links("[00](../notebooks/00_quickstart.ipynb) [g](GLOSSARY.md) [r](RESULTS.md)") == \
        "[00](lessons/00_quickstart.ipynb) [g](glossary.md) [r](results.md)"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    assert book.main(["--out", str(out)]) == 0
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_book_renders_links_figures_and_search(site):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking"])
        page = browser.new_page()
        page.goto(f"{site}/")
        assert "Course map" in page.inner_text("article")
        page.click("article a[href='lessons/05_cache_on_vs_off/']")  # a link from the map to a lesson
        page.wait_for_url("**/lessons/05_cache_on_vs_off/")
        assert "prefix caching off vs on" in page.inner_text("body")
        images = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
        assert images and all(images), "the lesson's figures show"
        page.goto(f"{site}/glossary/")
        broken = page.eval_on_selector_all("article a[href^='../lessons/']", "as => as.map(a => a.href)")
        for href in set(broken):
            assert page.request.get(href).ok, href
        page.goto(f"{site}/?q=eviction")
        page.wait_for_selector(".md-search-result__item", timeout=15_000)
        assert "eviction" in page.inner_text(".md-search-result").lower()
        browser.close()
