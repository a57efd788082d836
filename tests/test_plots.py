import plotly.graph_objects as go

from lab.experiments.plots import figures_dir, save_figure


def test_save_figure_writes_html_and_png(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_FIGURES_DIR", str(tmp_path))
    assert figures_dir() == tmp_path
    fig = go.Figure(go.Bar(x=["off", "on"], y=[36, 6]))
    written = save_figure(fig, "99_test-bars")
    assert [p.name for p in written] == ["99_test-bars.html", "99_test-bars.png"]
    assert (tmp_path / "99_test-bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
