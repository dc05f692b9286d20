"""Drawing many points: dense artists rasterized in vector files.

Filled bands and scatters of a million points make SVG and PDF files of 100 MB or more (a line
is simplified by matplotlib, a fill or markers are not)."""

from __future__ import annotations

from typing import Any

#: Fills and scatters of more points than this are rasterized in vector files (SVG, PDF).
RASTERIZE_ABOVE = 10_000


def rasterized(n: int) -> dict[str, Any]:
    """Keyword arguments of a fill or a scatter of ``n`` points: ``rasterized=True`` above
    :data:`RASTERIZE_ABOVE` (a picture at the file's dpi in a vector file, no change in a
    PNG), none below."""
    return {"rasterized": True} if n > RASTERIZE_ABOVE else {}
