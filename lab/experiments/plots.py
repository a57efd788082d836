"""Plotly figure export: interactive HTML always, static PNG through kaleido when a Chrome is found."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

from lab import PROJECT_ROOT
from lab.experiments.provenance import stamp_png
from lab.paths import folder

CHROME_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


COMMITTED_FIGURES_DIR = (
    PROJECT_ROOT / "figures"
)  # the canonical run's figures the docs show: `make promote` writes them


def figures_dir() -> Path:
    """Where a run's figures go: runs/figures/ in the project, or LAB_FIGURES_DIR (the tests point
    it elsewhere). Never figures/ itself: only `make promote` writes there, from the canonical run.
    """
    return folder("figures")


def find_chrome() -> str | None:
    path = os.environ.get("BROWSER_PATH")
    if path and Path(path).is_file():
        return path
    for name in CHROME_NAMES:
        if found := shutil.which(name):
            return found
    return None


# "0": no PNG unless asked for (the test suite's notebooks: see the root conftest.py)
PNG_ENV = "LAB_FIGURE_PNG"


def save_figure(fig, name: str, *, png: bool | None = None) -> list[Path]:
    """Write `name`.html (and `name`.png) under figures_dir(); returns the files written. `png`
    None: a PNG unless LAB_FIGURE_PNG is "0" (each PNG starts a Chrome for kaleido, about 2 s).

    Name figures after their notebook: `00_quickstart-ttft`.
    """
    out = figures_dir()
    html = out / f"{name}.html"
    fig.write_html(html, include_plotlyjs="directory")
    written = [html]
    if png if png is not None else os.environ.get(PNG_ENV, "1") != "0":
        if find_chrome() is None:
            warnings.warn(
                f"no Chrome/Chromium found for kaleido, so {name}.png was not written; "
                "install one (Debian: apt-get install chromium) or set BROWSER_PATH",
                stacklevel=2,
            )
        else:
            os.environ.setdefault(
                "BROWSER_PATH", find_chrome()
            )  # kaleido's browser lookup reads it
            with _quiet_browser_pipe():
                fig.write_image(out / f"{name}.png", width=900, height=500, scale=1)
            stamp_png(
                out / f"{name}.png", figure=name
            )  # the run that drew it, read back by `make promote`
            written.append(out / f"{name}.png")
    return written


@contextlib.contextmanager
def _quiet_browser_pipe() -> Iterator[None]:
    """kaleido's Chrome driver (choreographer) logs "JSONError decoding message. Ignoring" with a
    traceback when a busy machine splits a message from Chrome; it does ignore it and the PNG is
    written. In a notebook that log is a red traceback under the figure, read as a failed cell: keep
    it out while exporting."""
    # its own module makes the logger (logistro's class, with levels logging's lacks); never create
    # it first
    try:
        import choreographer.channels.pipe  # noqa: F401
    except ImportError:
        yield
        return
    logger = logging.getLogger("choreographer.channels.pipe")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


BLOCK_COLOURS = {"hit": "#b7e4c7", "miss": "#f4b6b6", "partial": "#e0e0e0"}


def block_map_html(pieces: list[str], block_size: int, num_cached_tokens: int) -> str:
    """A prompt's tokens (as text pieces) grouped into blocks, coloured hit / miss / partial (never
    cached)."""
    import html

    spans = []
    full_blocks = len(pieces) // block_size
    for b in range(0, len(pieces), block_size):
        index = b // block_size
        state = "hit" if b < num_cached_tokens else ("miss" if index < full_blocks else "partial")
        text = html.escape("".join(pieces[b : b + block_size])).replace("\n", "⏎")
        spans.append(
            f'<span title="block {index}: {state}" style="background:{BLOCK_COLOURS[state]};'
            f'border:1px solid #888;margin:1px;padding:1px;line-height:1.9">{text}</span>'
        )
    legend = " ".join(
        f'<span style="background:{c};padding:1px 6px">{k}</span>' for k, c in BLOCK_COLOURS.items()
    )
    return f"<div style='font-family:monospace;font-size:12px'>{legend}<br>{''.join(spans)}</div>"


def block_map_figure(pieces: list[str], block_size: int, num_cached_tokens: int, title: str = ""):
    """The block map as a figure (for export): one bar per block, coloured hit / miss / partial, the
    block's text on hover."""
    import plotly.graph_objects as go

    full_blocks = len(pieces) // block_size
    fig = go.Figure()
    for b in range(0, len(pieces), block_size):
        index = b // block_size
        state = "hit" if b < num_cached_tokens else ("miss" if index < full_blocks else "partial")
        tokens = len(pieces[b : b + block_size])
        fig.add_bar(
            x=[tokens],
            y=["prompt"],
            base=[b],
            orientation="h",
            marker_color=BLOCK_COLOURS[state],
            marker_line_color="#888",
            name=state,
            legendgroup=state,
            showlegend=False,
            hovertext="".join(pieces[b : b + block_size]),
            text=f"{index}",
            textposition="inside",
        )
    for state, colour in BLOCK_COLOURS.items():  # one legend entry per state
        fig.add_bar(x=[0], y=["prompt"], marker_color=colour, name=state, legendgroup=state)
    fig.update_layout(
        barmode="overlay",
        title=title
        or f"{len(pieces)} tokens in blocks of {block_size}: {num_cached_tokens} from cache",
        xaxis_title="token position",
        height=250,
    )
    return fig
