"""Compute kernels (no MPI inside): stencil updates, halo packing, the STREAM triad.

The applications in ``apps/`` call these between communication steps (the
stencil application between halo exchanges). Each kernel has a NumPy
reference, a compiled CPU path (numba) and a CuPy path behind one interface,
so the application picks a path once and never branches on it::

    import kernels
    kernels.PATHS                     # ("numpy", "compiled", "cupy")
    kernels.available("compiled")     # (True, "...") or (False, "numba is not installed: pip install ...")
    k = kernels.select("compiled")    # ValueError: unknown name; RuntimeError: cannot run here (with the fix)
    k.heat(u, v, c, box)              # explicit heat / Jacobi step, returns max |v - u|
    k.star(inp, out, r, box)          # PRK star stencil, returns Σ|out|
    k.pack(u, box, buf); k.unpack(buf, u, box)
    k.triad(a, b, c, s); k.sync()

Arrays include their ghost layers; a box is one ``(lo, hi)`` pair per
dimension in array indices. The CPU paths agree bit for bit; the CuPy path to
rounding. One module per kernel (heat.py, star.py, halo.py, stream.py) holds
its three implementations; paths.py selects them; ``python -m kernels.bench``
measures them against the STREAM bound.

Beside them, SIMT kernels written for numba-cuda (kernels/simt.py): a tiled
matrix multiply (matmul.py), CSR SpMV in its scalar and warp-per-row forms
(spmv.py), a fused bias + GELU (gelu.py) and the halo pack/unpack
(``halo.pack_simt``). They run on CuPy arrays on a GPU and in numba's CUDA
simulator on NumPy arrays, which is how CI executes their logic;
``python -m kernels.gpubench`` measures every GPU kernel against its bound.
"""

from .paths import PATHS, Kernels, available, select

__all__ = ["PATHS", "available", "select", "Kernels"]
