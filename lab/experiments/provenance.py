"""Which run made a file: the runner names each notebook run (LAB_RUN_ID), results files record it
in their provenance, and every PNG figure carries it in its own text chunks, so a figure can be
traced to its run.

    current_run()                      # "05_cache_on_vs_off-full-20261201T153855", or None outside the runner
    stamp_png(path, notebook=...)      # writes lab:run, lab:profile and lab:figure into the PNG
    png_text(path)                     # {"lab:run": ..., ...}
"""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image, PngImagePlugin, UnidentifiedImageError


def current_run() -> str | None:
    """The run the runner (lab.tools.runner) started this kernel for; None in an interactive
    session."""
    return os.environ.get("LAB_RUN_ID") or None


def stamp_png(path: Path, **fields: str) -> None:
    """Write text chunks lab:run, lab:profile and lab:NAME for each of `fields` into the PNG at
    `path`, beside the text it holds already. Pillow writes the image again (the pixels are the
    same), to a temporary file renamed over the old one."""
    path = Path(path)
    text = {
        "run": current_run() or "interactive",
        "profile": os.environ.get("LAB_PROFILE", "interactive"),
        **fields,
    }
    try:
        image = Image.open(path)
    except UnidentifiedImageError:
        raise ValueError(f"{path} is not a PNG file") from None
    with image:
        if image.format != "PNG":
            raise ValueError(f"{path} is not a PNG file")
        info = PngImagePlugin.PngInfo()
        for key, value in (
            image.text | {f"lab:{key}": str(value) for key, value in text.items()}
        ).items():
            info.add_text(key, value)
        tmp = path.with_name(f".{path.name}.tmp")
        image.save(tmp, format="PNG", pnginfo=info)
    os.replace(tmp, path)


def png_text(path: Path) -> dict[str, str]:
    """The text chunks of a PNG file, keyword -> text."""
    with Image.open(path) as image:
        return dict(image.text)
