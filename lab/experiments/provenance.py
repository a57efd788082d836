"""Which run made a file: the runner names each notebook run (LAB_RUN_ID), results files record it in their
provenance, and every PNG figure carries it in its own text chunks, so a figure can be traced to its run.

    current_run()                      # "05_cache_on_vs_off-full-20261201T153855", or None outside the runner
    stamp_png(path, notebook=...)      # writes lab:run, lab:profile and lab:figure into the PNG
    png_text(path)                     # {"lab:run": ..., ...}
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def current_run() -> str | None:
    """The run the runner (lab.tools.runner) started this kernel for; None in an interactive session."""
    return os.environ.get("LAB_RUN_ID") or None


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def stamp_png(path: Path, **fields: str) -> None:
    """Add tEXt chunks (lab:run, lab:profile, and `fields` as lab:NAME) right after the PNG's header chunk."""
    data = path.read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"{path} is not a PNG file")
    header_end = len(PNG_SIGNATURE) + 8 + struct.unpack(">I", data[8:12])[0] + 4
    text = {"run": current_run() or "interactive", "profile": os.environ.get("LAB_PROFILE", "interactive"), **fields}
    chunks = b"".join(_chunk(b"tEXt", f"lab:{key}".encode() + b"\0" + str(value).encode("latin-1"))
                      for key, value in text.items())
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data[:header_end] + chunks + data[header_end:])
    os.replace(tmp, path)


def png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a PNG file, keyword -> text."""
    data, pos, found = Path(path).read_bytes(), len(PNG_SIGNATURE), {}
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I", data[pos:pos + 4])[0], data[pos + 4:pos + 8]
        if kind == b"tEXt":
            key, _, value = data[pos + 8:pos + 8 + length].partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        if kind == b"IEND":
            break
        pos += 12 + length
    return found
