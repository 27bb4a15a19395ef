"""The width and height of a PNG the figures wrote, read from its header (no image library needed)."""
from pathlib import Path


def png_size(path) -> tuple[int, int]:
    """``(width, height)`` from a PNG's IHDR chunk; AssertionError if the file is no PNG."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG file"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
