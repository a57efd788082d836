import plotly.graph_objects as go

from lab import PROJECT_ROOT
from lab.experiments.plots import COMMITTED_FIGURES_DIR, figures_dir, save_figure
from lab.experiments.provenance import png_text


def test_save_figure_writes_html_and_png(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_FIGURES_DIR", str(tmp_path))
    monkeypatch.delenv("LAB_FIGURE_PNG", raising=False)  # as in `make run` and a learner's JupyterLab
    assert figures_dir() == tmp_path
    fig = go.Figure(go.Bar(x=["off", "on"], y=[36, 6]))
    written = save_figure(fig, "99_test-bars")
    assert [p.name for p in written] == ["99_test-bars.html", "99_test-bars.png"]
    assert (tmp_path / "99_test-bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_test_suites_notebooks_write_html_only_unless_a_png_is_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_FIGURES_DIR", str(tmp_path))
    monkeypatch.setenv("LAB_FIGURE_PNG", "0")
    fig = go.Figure(go.Bar(y=[1, 2]))
    assert [p.name for p in save_figure(fig, "99_test-html")] == ["99_test-html.html"]
    assert [p.name for p in save_figure(fig, "99_test-asked", png=True)] == ["99_test-asked.html", "99_test-asked.png"]


def test_a_png_records_the_run_that_drew_it_and_a_run_never_writes_the_committed_figures(tmp_path, monkeypatch):
    monkeypatch.delenv("LAB_FIGURES_DIR")
    assert figures_dir() == PROJECT_ROOT / "runs" / "figures" != COMMITTED_FIGURES_DIR
    monkeypatch.setenv("LAB_FIGURES_DIR", str(tmp_path))
    monkeypatch.setenv("LAB_RUN_ID", "99_test-full-20260101T000000")
    monkeypatch.setenv("LAB_PROFILE", "full")
    png = save_figure(go.Figure(go.Bar(y=[1, 2])), "99_test-stamped", png=True)[-1]
    assert png_text(png) == {"lab:run": "99_test-full-20260101T000000", "lab:profile": "full",
                             "lab:figure": "99_test-stamped"}
    from PIL import Image  # a PNG decoder reads the stamped file as before

    with Image.open(png) as image:
        image.load()
        assert image.size == (900, 500) and image.text["lab:run"] == "99_test-full-20260101T000000"
