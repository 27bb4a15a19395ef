"""``cupyx`` of the CuPy stand-in (tests/cupy_standin/cupy): only ``cupyx.scipy.sparse``."""
