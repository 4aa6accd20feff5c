"""Compute kernels (no MPI inside): stencil updates, halo packing, reductions.

The applications in ``apps/`` call these between communication steps; each
kernel has a NumPy reference, a compiled CPU path and a CuPy path with one
interface. (The stencil application brings the first kernels.)
"""
