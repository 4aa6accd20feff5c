"""Build the one compiled module, the executor's lane (mpicomm/engine/_lane.c); all metadata lives in setup.cfg.

It needs a C compiler and Python's headers, not MPI's: it calls the MPI library that mpi4py loaded through
function pointers (mpicomm/engine/lane.py), so one build serves MPICH, Open MPI and the standard ABI.
"""

from setuptools import Extension, setup

# -fwrapv: integer sums wrap as NumPy's do; -ffp-contract=off: no fused multiply-add, so floating-point results
# are NumPy's bit for bit.
setup(ext_modules=[Extension("mpicomm.engine._lane", ["mpicomm/engine/_lane.c"],
                             extra_compile_args=["-O3", "-fwrapv", "-ffp-contract=off", "-std=gnu11", "-Wall"])])
