"""mpi4py's own test suite, run with mpicomm.Comm in place of mpi4py's communicators.

    mpiexec -n 3 python -m tests.compat.mpi4py_suite                 # the modules in MODULES
    mpiexec -n 2 python -m tests.compat.mpi4py_suite test_cco_buf    # some of them
    mpiexec -n 2 python -m tests.compat.mpi4py_suite --list-failures # print what fails, as DIFFERENCES lines

The suite is the ``test/`` folder of the installed mpi4py's source release
(``python -m tests.compat.fetch`` puts it in ``.cache/``). Each module is
imported as mpi4py's runner would, then rewired: the module's ``MPI`` becomes
a view of mpi4py.MPI whose ``COMM_WORLD`` and ``COMM_SELF`` are
``mpicomm.Comm`` objects over the real ones, and every test class's ``COMM``
that is one of those becomes the same ``Comm``. So ``COMM.Allreduce(...)``,
``MPI.COMM_WORLD.Dup()``, ``comm.Create_cart(...)`` and the rest run through
mpicomm exactly as a user's program that swapped its communicator would.
Array backends that need a GPU are dropped where none is usable, and the
"fake GPU" ones (host memory behind ``__cuda_array_interface__``) always:
mpicomm takes that interface as device memory, as its real exporters mean.

Every test either passes, or is listed in :data:`DIFFERENCES` with the reason
(what stays the library's, or where mpicomm differs on purpose). The run
fails on a test that fails unlisted, and on a listed one that passes (the
list must stay true). Rank 0 prints one line per module and the verdict.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import io
import os
import sys
import time
import types
import unittest

from mpi4py import MPI

import mpicomm

#: The modules run: collectives (blocking, nonblocking, persistent; buffers, vectors, objects, neighbourhood;
#: intercommunicators made from mpicomm communicators), point-to-point, message specs, requests, communicators
#: and topologies, one-sided windows over mpicomm communicators, attributes, error handlers, the object model,
#: pickle-5 messaging, threads.
MODULES = (
    "test_cco_buf", "test_cco_nb_buf", "test_cco_pr_buf",
    "test_cco_vec", "test_cco_nb_vec", "test_cco_pr_vec",
    "test_cco_obj",
    "test_cco_ngh_buf", "test_cco_ngh_obj", "test_cco_pr_ngh_buf",
    "test_p2p_buf", "test_p2p_obj", "test_p2p_buf_matched", "test_p2p_obj_matched",
    "test_p2p_buf_part", "test_msgzero", "test_msgspec", "test_status", "test_request",
    "test_comm", "test_comm_topo", "test_comm_inter", "test_cco_buf_inter", "test_cco_vec_inter", "test_cco_obj_inter",
    "test_rma", "test_rma_nb", "test_win", "test_attributes", "test_errhandler", "test_exceptions", "test_objmodel",
    "test_util_pkl5", "test_threads",
)

#: Tests that do not pass through mpicomm.Comm, as ``(pattern, symptom, reason)``: a failure is listed when its
#: id (``module.Class.test``) matches *pattern* (fnmatch wildcards) and its traceback contains *symptom*, so a
#: listed test failing for another reason still fails the run. The run also fails if no listed test fails.
DIFFERENCES: tuple[tuple[str, str, str], ...] = (
    ("test_comm_topo.*.test*comm*", "!= <class 'mpicomm.comm.",
     "MPI.Comm.fromint/f2py (mpi4py's handle conversions) make mpi4py's own class of the topology (Cartcomm...); "
     "the communicator they are compared with was made through mpicomm and is mpicomm's subclass of it "
     "(CartComm...), so the test's type(new) == type(old) differs; the handles are equal"),
    ("test_objmodel.TestObjModel.test*", "<class 'mpicomm.comm.Comm'>",
     "the same: mpi4py's handle conversions (fromhandle, fromint, f2py, the C API) make mpi4py's Intracomm of "
     "an mpicomm.Comm's handle"),
    ("test_msgspec.TestMessageVector.testMessageBad", "assertRaises(KeyError",
     "a type string mpi4py cannot map raises KeyError there; mpicomm refuses it, as every bad argument, with "
     "mpicomm.ArgumentError (a ValueError and TypeError), the same on every rank"),
)


def source_dir() -> str:
    """The ``test/`` folder of the installed mpi4py's source release, as ``python -m tests.compat.fetch`` puts it."""
    from tests.compat.fetch import default_dest, installed_version

    return os.path.join(default_dest(installed_version()), "test")


class _MPIView(types.ModuleType):
    """mpi4py.MPI, but with mpicomm communicators for the predefined ones."""

    def __init__(self, world: mpicomm.Comm, self_: mpicomm.Comm) -> None:
        super().__init__("mpi4py.MPI")
        self.COMM_WORLD = world
        self.COMM_SELF = self_

    def __getattr__(self, name: str) -> object:
        return getattr(MPI, name)


def _gpu_usable() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean none usable
        return False


def _drop_gpu_tests(module: types.ModuleType, gpu: bool) -> None:
    """Remove the test classes and methods of GPU array types that cannot run here (see run)."""
    def unwanted(name: str) -> bool:
        return "CAIBuf" in name or (not gpu and ("Numba" in name or "CuPy" in name))

    for name, value in list(vars(module).items()):
        if isinstance(value, type) and issubclass(value, unittest.TestCase):
            if unwanted(name):
                delattr(module, name)
                continue
            for klass in value.__mro__:
                for attr in [a for a in vars(klass) if a.startswith("test") and unwanted(a)]:
                    delattr(klass, attr)


def _rewire(module: types.ModuleType, view: _MPIView) -> None:
    swap = {id(MPI.COMM_WORLD): view.COMM_WORLD, id(MPI.COMM_SELF): view.COMM_SELF}
    if getattr(module, "MPI", None) is MPI:
        module.MPI = view  # type: ignore[attr-defined]
    for value in list(vars(module).values()):
        if isinstance(value, type):
            for klass in value.__mro__:
                comm = vars(klass).get("COMM")
                if comm is not None and id(comm) in swap:
                    klass.COMM = swap[id(comm)]  # type: ignore[attr-defined]


def _ids(suite: unittest.TestSuite) -> list[str]:
    out = []
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            out += _ids(test)
        else:
            out.append(test.id())
    return out


def _listed(test_id: str, traceback: str) -> bool:
    return any(fnmatch.fnmatchcase(test_id, pattern) and symptom in traceback for pattern, symptom, _ in DIFFERENCES)


def run(modules: list[str], where: str, verbose: bool = False) -> tuple[dict[str, tuple[int, dict[str, bool], float]], str]:
    """Run *modules* from *where*; per module (tests run, {id failed on this rank: listed?}, seconds), and the log."""
    sys.path.insert(0, where)
    gpu = _gpu_usable()
    if not gpu:
        # CuPy installed where no GPU is usable (CI installs it to compile the CUDA sources): mpi4py's array
        # backends and test_msgspec allocate CuPy arrays as they import where CuPy imports, so it is hidden from
        # them, as on a machine without it (None in sys.modules: importing it raises ImportError)
        sys.modules["cupy"] = None  # type: ignore[assignment]
    import arrayimpl  # type: ignore[import-not-found]  # mpi4py's array backends (NumPy, array, CuPy, numba...)

    # mpi4py's "fake GPU" arrays (and test_msgspec's CAIBuf) put host memory behind __cuda_array_interface__,
    # which only an MPI library that reads any pointer as host memory accepts; mpicomm takes that interface as
    # device memory (CuPy moves and reduces it), as every real exporter of it means. Left out, as the GPU
    # backends (CuPy, Numba) are where no GPU is usable.
    gpu = _gpu_usable()
    arrayimpl.ArrayBackends[:] = [
        b for b in arrayimpl.ArrayBackends
        if not issubclass(b, arrayimpl.BaseFakeGPUArray) and (gpu or b.backend not in ("cupy", "dlpack-cupy", "numba"))
    ]
    view = _MPIView(mpicomm.Comm(MPI.COMM_WORLD), mpicomm.Comm(MPI.COMM_SELF))
    log = io.StringIO()
    results = {}
    for name in modules:
        module = importlib.import_module(name)
        _drop_gpu_tests(module, gpu)
        _rewire(module, view)
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
        start = time.perf_counter()
        outcome = unittest.TextTestRunner(stream=log, verbosity=2 if verbose else 1).run(suite)
        failed: dict[str, bool] = {}
        for test, traceback in outcome.failures + outcome.errors:
            failed[test.id()] = failed.get(test.id(), True) and _listed(test.id(), traceback)
        for test in outcome.unexpectedSuccesses:
            failed[test.id()] = False
        results[name] = (outcome.testsRun, failed, time.perf_counter() - start)
    return results, log.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat.mpi4py_suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"test modules (default: all {len(MODULES)} of MODULES)")
    parser.add_argument("--source", default=None,
                        help="mpi4py's test/ folder (default: .cache/mpi4py-<installed version>/test)")
    parser.add_argument("--list-failures", action="store_true",
                        help="print every failing test id (listed or not) and the tracebacks of rank 0")
    parser.add_argument("-v", "--verbose", action="store_true", help="unittest's verbose output into the log")
    args = parser.parse_args(argv)
    where = args.source or source_dir()
    world = MPI.COMM_WORLD
    if not os.path.isdir(where):
        if world.rank == 0:
            parser.error(f"--source {where}: no such folder; fetch mpi4py's tests first: python -m tests.compat.fetch")
        return 2
    unknown = [m for m in args.modules if not os.path.exists(os.path.join(where, m + ".py"))]
    if unknown:
        if world.rank == 0:
            parser.error(f"no test module {', '.join(unknown)} in {where}")
        return 2
    modules = args.modules or list(MODULES)
    results, log = run(modules, where, args.verbose)
    everyone = world.gather(results, root=0)
    logs = world.gather(log if args.list_failures else "", root=0)
    if world.rank != 0:
        return 0
    assert everyone is not None and logs is not None
    unexpected: list[str] = []
    passing_listed: list[str] = []
    listed_failed: set[str] = set()
    print(f"mpi4py's own tests through mpicomm.Comm at {world.size} rank(s), from {where}")
    for name in modules:
        run_count = everyone[0][name][0]
        failed = sorted({t for r in everyone for t in r[name][1]})
        seconds = max(r[name][2] for r in everyone)
        mine = [t for t in failed if not all(r[name][1].get(t, True) for r in everyone)]
        unexpected += mine
        listed_failed.update(t for t in failed if t not in mine)
        print(f"  {name:<24} {run_count:>4} tests  {len(failed):>3} failed ({len(mine)} unlisted)  {seconds:6.1f} s")
    loaded = {t for name in modules for t in _ids(unittest.defaultTestLoader.loadTestsFromName(name))}
    for pattern, _, _ in DIFFERENCES:
        matching = [t for t in loaded if fnmatch.fnmatchcase(t, pattern)]
        if matching and not any(t in listed_failed for t in matching):
            passing_listed.append(pattern)
    if args.list_failures:
        print(logs[0])
    for t in unexpected:
        print(f"FAILED (not in DIFFERENCES): {t}")
    for p in passing_listed:
        print(f"PASSES (listed in DIFFERENCES, remove it): {p}")
    verdict = not unexpected and not passing_listed
    print("mpi4py suite: " + ("ok" if verdict else f"{len(unexpected)} unlisted failure(s), "
                                                    f"{len(passing_listed)} listed pattern(s) passing"))
    return 0 if verdict else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    if code and MPI.COMM_WORLD.size > 1:
        MPI.COMM_WORLD.Abort(code)
    sys.exit(code)
