"""Plotly figure export: interactive HTML always, static PNG through kaleido when a Chrome is found."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

from lab import PROJECT_ROOT

CHROME_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def figures_dir() -> Path:
    """Where figures go: figures/ in the project, or LAB_FIGURES_DIR (the tests point it elsewhere)."""
    path = Path(os.environ.get("LAB_FIGURES_DIR", PROJECT_ROOT / "figures"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def find_chrome() -> str | None:
    path = os.environ.get("BROWSER_PATH")
    if path and Path(path).is_file():
        return path
    for name in CHROME_NAMES:
        if found := shutil.which(name):
            os.environ["BROWSER_PATH"] = found  # kaleido's browser lookup reads this
            return found
    return None


def save_figure(fig, name: str, *, png: bool = True) -> list[Path]:
    """Write `name`.html (and `name`.png) under figures_dir(); returns the files written.

    Name figures after their notebook: `00_quickstart-ttft`.
    """
    out = figures_dir()
    html = out / f"{name}.html"
    fig.write_html(html, include_plotlyjs="directory")
    written = [html]
    if png:
        if find_chrome() is None:
            warnings.warn(
                f"no Chrome/Chromium found for kaleido, so {name}.png was not written; "
                "install one (Debian: apt-get install chromium) or set BROWSER_PATH", stacklevel=2
            )
        else:
            fig.write_image(out / f"{name}.png", width=900, height=500, scale=1)
            written.append(out / f"{name}.png")
    return written
