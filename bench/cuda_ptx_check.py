"""Compile the CUDA LiDAR kernels (gsim.lidar.kernel_cuda) to PTX for a GPU architecture on a machine without one:
what the simulator cannot show (that numba-cuda compiles them, the CPU kernel's njit functions included).

    pip install numba-cuda nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12   (in a scratch environment)
    CUDA_HOME=<site-packages>/nvidia/cuda_nvcc python bench/cuda_ptx_check.py [--cc 9.0]

Prints each kernel's PTX size (and whether it spills to local memory); fails where a kernel does not compile.
"""
from __future__ import annotations

import argparse

import numpy as np
from numba import cuda, typeof

from gsim.lidar import kernel_cuda as kc


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="9.0", help="compute capability (9.0: H100/H200)")
    cc = tuple(int(x) for x in ap.parse_args(argv).cc.split("."))
    f4, f8, i4, i8 = np.float32, np.float64, np.int32, np.int64
    a = lambda shape, dt: np.zeros(shape, dt)  # noqa: E731  (example arguments: their types are what count)
    kernels = {
        "_records": (a((2, 3), f8), a((2, 4), f8), a((2, 2), f8), a(2, f8), a((2, 13), f4)),
        "_caps": (a((2, 13), f4), a((2, 2), f4), a(2, i8), a((1, 2, 3, 4), f8), a((1, 3), f8), a((1, 3, 3), f8),
                  a((1, 2), f8), 0.1, a((1, 7), f8), a((1, 2, 4), i8), a((1, 2), f4), a((1, 2, 7), f4)),
        "_pairs": (a((2, 4), i8), a(2, i4), a(2, i8), a(2, i8), a(2, i8), a(2, i8), a(3, i8), a(3, i8)),
    }
    # the two composites: units, then lst, src, rays, ray_bundle, rec, cap, feats, group, group_from_world, o_refs,
    # origins, dirs, column, inv2, hit; the segments' tables (cells only); the outputs; the scan flag (cells only)
    common = (a(3, i8), a(3, i8), a(3, i8), a(3, i8), a((2, 13), f4), a((2, 7), f4), a((2, 8), f4), a(2, i8),
              a((2, 3, 3, 4), f8), a((2, 3), f8), a((3, 3), f8), a((3, 3), f8), a(3, i8), f4(1), f4(0.5))
    outs = (a(3, f4), a(3, f4), a(3, f4), a((3, 3), f4), a((3, 8), f4), a((3, 4), i8))
    parts = (a(4, f4), a(4, i8), a((4, 6), f4), a((4, 8), f4))
    kernels["_composite_rays"] = (a((2, 6), i8),) + common + outs
    kernels["_composite_cells"] = (a((2, 6), i8),) + common + parts + outs + (True,)
    kernels["_segment_starts"] = (a((2, 3), i8), parts[0], parts[1])
    kernels["_segment_sums"] = (a((2, 3), i8), a(3, i8), parts[2], parts[3]) + outs[:5]
    for name, args in kernels.items():
        ptx, _ = cuda.compile_ptx(getattr(kc, name).py_func, tuple(typeof(x) for x in args), cc=cc)
        print(f"{name}: {len(ptx)} characters of PTX for sm_{cc[0]}{cc[1]}"
              f"{', local memory' if '.local' in ptx else ''}")


if __name__ == "__main__":
    main()
