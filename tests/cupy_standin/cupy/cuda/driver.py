"""``cupy.cuda.driver``: the error CUDA's driver API raises."""


class CUDADriverError(RuntimeError):
    pass
