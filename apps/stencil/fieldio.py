"""The field on disk and on screen: checkpoints with MPI-IO, a decomposition-free digest, a picture.

Checkpoints hold the owned cells of every field in *global* order, written
collectively with MPI-IO through a subarray file view, so a run restarts on
any number of ranks and the file does not depend on the decomposition. The
data file is written under a temporary name that rank 0 first creates
exclusively, under an unpredictable name (``O_EXCL|O_NOFOLLOW``); the ranks open
that file without ``MODE_CREATE``, so a symbolic link planted in the directory
is never written through. Rank 0 then checks it is still the file it made,
hashes it, renames it into place and writes the manifest last
(``apps.checkpoint``): a run killed at any moment leaves no checkpoint that
could be loaded half-written. Loading verifies the manifest's own checksum,
every field of it, and the data's checksum on rank 0 first, and refuses a
damaged, edited or partial checkpoint with the reason, on every rank.

The digest is a checksum of the final fields that is the same whatever the
decomposition: every cell's bits are mixed with its global index and the
results are summed modulo 2⁶⁴ (an exact, order-free reduction), so "bit for bit
identical for every N and every halo mode" is one line to compare.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import numpy as np
from mpi4py import MPI

from apps import checkpoint
from apps.agree import agree, from_root
from mpicomm.transport import buffers

from .grid import Grid

__all__ = ["PREFIX", "prepare", "save", "load", "digest", "gather", "plot"]

PREFIX = "stencil"


def _file_type(grid: Grid, dtype: np.dtype) -> tuple[MPI.Datatype, MPI.Datatype, tuple[int, ...]]:
    n = grid.layout.owned[1] - grid.layout.owned[0]
    gshape = (n,) * grid.ndim
    etype = buffers.mpi_datatype(dtype)
    ftype = etype.Create_subarray(list(gshape), list(grid.size), list(grid.starts), order=MPI.ORDER_C).Commit()
    return etype, ftype, gshape


def _on_rank0(comm: MPI.Intracomm, work, what: str):
    """Run *work()* on rank 0; its result on every rank, or its error as CheckpointError on every rank."""
    return from_root(comm, work, checkpoint.CheckpointError, (OSError, ValueError, KeyError, TypeError), what)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def prepare(comm: MPI.Intracomm, directory: str, fresh: bool) -> None:
    """Make sure *directory* can take checkpoints before the run starts (collective).

    Every rank must be able to create and write files there
    (:func:`apps.checkpoint.prepare_directory`). A fresh run (no
    ``--restart``) refuses a directory that already holds checkpoints of the
    series: they may be another run's, and the new run's would replace them.
    """
    checkpoint.prepare_directory(comm, directory)  # every rank writes there (MPI-IO): every rank probes it

    def work() -> None:
        found = checkpoint.steps(directory, PREFIX)
        if fresh and found:
            raise checkpoint.CheckpointError(
                f"--checkpoint-dir {directory} already holds checkpoints (newest: iteration {found[0]}); pass "
                f"--restart to resume from them, or use another --checkpoint-dir"
            )

    _on_rank0(comm, work, f"--checkpoint-dir {directory}")


def save(grid: Grid, fields: dict[str, Any], step: int, directory: str, keep: int, **meta: Any) -> str:
    """Write a checkpoint of *fields* at *step* into *directory* (collective); returns the manifest path.

    Checkpoints of later steps (left by an abandoned run this one restarted
    before) are removed, so pruning never drops the one just written.
    """
    comm = grid.cart
    final = checkpoint.data_path(directory, PREFIX, step)

    def create() -> tuple[str, tuple[int, int]]:
        # Rank 0 creates the temporary file exclusively under an unpredictable name (O_EXCL|O_NOFOLLOW);
        # the ranks then open that file without MODE_CREATE, so a planted link is never written through.
        os.makedirs(directory, exist_ok=True)
        tmp = checkpoint.temporary(final)
        st = os.lstat(tmp)
        return tmp, (st.st_dev, st.st_ino)

    tmp, identity = _on_rank0(comm, create, f"--checkpoint-dir {directory}")
    arrays, offset = [], 0
    failure = None
    try:
        fh = MPI.File.Open(comm, tmp, MPI.MODE_WRONLY)
        try:
            for name, a in fields.items():
                local = grid.owned_host(a)
                etype, ftype, gshape = _file_type(grid, local.dtype)
                try:
                    fh.Set_view(offset, etype, ftype)
                    fh.Write_all(local)
                finally:
                    ftype.Free()
                nbytes = int(np.prod(gshape)) * local.dtype.itemsize
                arrays.append({"name": name, "dtype": local.dtype.str, "shape": list(gshape), "offset": offset,
                               "bytes": nbytes})
                offset += nbytes
            fh.Sync()
        finally:
            fh.Close()
    except MPI.Exception as exc:
        failure = f"writing {tmp} with MPI-IO: {exc.Get_error_string()}"
    try:
        agree(comm, failure, checkpoint.CheckpointError)
    except checkpoint.CheckpointError:
        if comm.Get_rank() == 0:
            _unlink(tmp)
        raise
    mpath = checkpoint.manifest_path(directory, PREFIX, step)

    def commit() -> None:
        try:
            st = os.lstat(tmp)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != identity:
                raise checkpoint.CheckpointError(f"{tmp} was replaced while the checkpoint was written; not committed")
            for later in checkpoint.steps(directory, PREFIX):
                if later >= step:
                    checkpoint.remove(directory, PREFIX, later)
            record = checkpoint.file_record(tmp)
            record["file"] = os.path.basename(final)
            checkpoint.commit(tmp, final)
        except BaseException:
            _unlink(tmp)
            raise
        checkpoint.save_manifest(mpath, step, [record], arrays=arrays, **meta)
        checkpoint.prune(directory, PREFIX, keep)
        checkpoint.sweep(directory, PREFIX)

    _on_rank0(comm, commit, f"writing checkpoint {mpath}")
    return mpath


def _check_manifest(body: dict[str, Any]) -> None:
    """The stencil's own manifest fields: one data file, its arrays inside it, a numeric residual."""
    where = body["path"]
    files = body["files"]
    if len(files) != 1:
        raise checkpoint.CheckpointError(f"{where}: names {len(files)} data files, a stencil checkpoint has one")
    arrays = body.get("arrays")
    if not isinstance(arrays, list) or not arrays:
        raise checkpoint.CheckpointError(f"{where}: manifest lacks 'arrays' (the fields stored)")
    checkpoint.check_entries(arrays, files[0]["bytes"], where)
    residual = body.get("residual")
    if residual is not None and (isinstance(residual, bool) or not isinstance(residual, (int, float))):
        raise checkpoint.CheckpointError(f"{where}: residual {residual!r} is not a number")


def load(grid: Grid, fields: dict[str, Any], directory: str, expect: dict[str, Any]) -> tuple[dict | None, list[str]]:
    """Fill *fields* from the newest valid checkpoint in *directory* (collective).

    Returns ``(manifest, refused)``: the manifest loaded (None when the
    directory holds no checkpoint) and why newer ones were refused. Raises
    :class:`apps.checkpoint.CheckpointError` on every rank when checkpoints
    exist but none is valid, or the valid one belongs to another problem
    (*expect*: the settings that must match).
    """
    comm = grid.cart

    def find():
        if not os.path.isdir(directory):
            return None, [], False
        body, refused = checkpoint.newest_valid(directory, PREFIX, check=_check_manifest)
        return body, refused, bool(checkpoint.steps(directory, PREFIX))

    body, refused, any_found = _on_rank0(comm, find, f"reading checkpoints in {directory}")
    if body is None:
        if any_found:
            raise checkpoint.CheckpointError(
                f"no valid checkpoint in {directory}; refused: " + "; ".join(refused)
                + " — remove the damaged files or run without --restart"
            )
        return None, refused
    wrong = {k: (body.get(k), v) for k, v in expect.items() if body.get(k) != v}
    if wrong:
        what = ", ".join(f"{k} {have!r} (this run: {want!r})" for k, (have, want) in wrong.items())
        raise checkpoint.CheckpointError(
            f"{body['path']} is a checkpoint of another problem: {what}; use another --checkpoint-dir or the same settings"
        )
    path = os.path.join(directory, body["files"][0]["file"])
    if sorted(e["name"] for e in body["arrays"]) != sorted(fields):
        raise checkpoint.CheckpointError(f"{body['path']} holds fields {[e['name'] for e in body['arrays']]}, "
                                         f"this problem has {sorted(fields)}")
    n = grid.layout.owned[1] - grid.layout.owned[0]
    for entry in body["arrays"]:
        want = (np.dtype(fields[entry["name"]].dtype).str, [n] * grid.ndim)
        if (entry["dtype"], entry["shape"]) != want:
            raise checkpoint.CheckpointError(
                f"{body['path']}: field {entry['name']!r} is stored as {entry['dtype']} {entry['shape']}, this run "
                f"needs {want[0]} {want[1]}; the manifest does not describe this problem's field (refused)")
    try:
        fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
        try:
            for entry in body["arrays"]:
                a = fields[entry["name"]]
                dtype = np.dtype(entry["dtype"])
                local = np.empty(grid.size, dtype)
                etype, ftype, _ = _file_type(grid, dtype)
                try:
                    fh.Set_view(entry["offset"], etype, ftype)
                    fh.Read_all(local)
                finally:
                    ftype.Free()
                a[grid.owned] = buffers.array_module(a).asarray(local)  # CuPy: copied to the device
        finally:
            fh.Close()
    except MPI.Exception as exc:
        raise checkpoint.CheckpointError(f"reading {path} with MPI-IO: {exc.Get_error_string()}") from None
    return body, refused


_MIX1 = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)


def digest(grid: Grid, fields: dict[str, Any]) -> str:
    """A 64-bit hex checksum of the fields' owned cells, independent of the decomposition (collective)."""
    total = np.zeros(1, np.uint64)
    n = grid.layout.owned[1] - grid.layout.owned[0]
    with np.errstate(over="ignore"):
        for f, (_name, a) in enumerate(sorted(fields.items())):
            local = grid.owned_host(a)
            bits = local.view(np.uint64 if local.dtype.itemsize == 8 else np.uint32).astype(np.uint64)
            index = np.zeros(local.shape, np.uint64)
            for k in range(grid.ndim):
                shape = [1] * grid.ndim
                shape[k] = local.shape[k]
                g = np.arange(grid.starts[k], grid.starts[k] + local.shape[k], dtype=np.uint64).reshape(shape)
                index = index * np.uint64(n) + g
            h = (bits ^ ((index + np.uint64(f << 56)) * _MIX1)) * _MIX2
            h ^= h >> np.uint64(31)
            total += h.sum(dtype=np.uint64)
    out = np.zeros(1, np.uint64)
    grid.cart.Allreduce(total, out, op=MPI.SUM)
    return f"{int(out[0]):016x}"


def gather(grid: Grid, a: Any) -> np.ndarray | None:
    """The owned cells of *a* from every rank, assembled on rank 0 (None elsewhere)."""
    parts = grid.cart.gather((grid.starts, grid.owned_host(a)), root=0)
    if parts is None:
        return None
    n = grid.layout.owned[1] - grid.layout.owned[0]
    whole = np.empty((n,) * grid.ndim, parts[0][1].dtype)
    for starts, block in parts:
        whole[tuple(slice(s, s + b) for s, b in zip(starts, block.shape))] = block
    return whole


def plot(grid: Grid, a: Any, path: str, title: str) -> None:
    """Save a picture of field *a* (the middle plane of a 3-D field) to *path* (collective; rank 0 draws)."""
    whole = gather(grid, a)
    if whole is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picture = whole[whole.shape[0] // 2] if whole.ndim == 3 else whole
    fig, ax = plt.subplots(figsize=(6, 5), dpi=120)
    im = ax.imshow(picture, origin="lower", cmap="inferno", interpolation="nearest")
    fig.colorbar(im, ax=ax)
    ax.set_title(title + (" (middle plane)" if whole.ndim == 3 else ""))
    ax.set_xlabel("j")
    ax.set_ylabel("i")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
