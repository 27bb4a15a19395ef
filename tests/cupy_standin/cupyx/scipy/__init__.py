"""``cupyx.scipy`` of the CuPy stand-in: only ``sparse``."""
