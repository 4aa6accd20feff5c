"""Pipeline checkpoints: one data file per stage and tensor rank, one manifest, through :mod:`apps.checkpoint`.

Replica 0's ranks write their stages' parameters and optimizer state
(``pipeline-<step>.stage<s>-t<t>.bin``, atomic, checksummed); rank 0 writes the
manifest naming every file, the arrays in each (``parts``) and the run's
signature: the model, the split (stages, chunks, tensor ranks, the blocks of
each stage), optimizer, learning rate, seed, dtype and batch. A restart
(:func:`load`) takes the newest checkpoint whose manifest and files all verify
(an older one when the newest is damaged) and refuses, on every rank, one
written by another model, split or run. Every rank learns of every failure:
writing and reading agree on the outcome before anyone goes on, so no rank is
left waiting in the next step while another has failed.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from apps import checkpoint as ck
from apps.agree import agree, verdict
from apps.nn.xp import to_host

__all__ = ["PREFIX", "signature", "save", "load", "saved_bounds"]

PREFIX = "pipeline"  # the checkpoint series' name


def signature(cfg: Any, bounds: list[tuple[int, int]]) -> dict[str, Any]:
    """What a checkpoint must match to be resumed by this run."""
    return {"spec": asdict(cfg.spec), "stages": cfg.stages, "chunks": cfg.chunks, "tensor": cfg.tensor,
            "bounds": [list(b) for b in bounds], "optimizer": cfg.optimizer, "lr": cfg.lr, "seed": cfg.seed,
            "dtype": cfg.dtype, "batch": cfg.batch}


def _part(stage: int, t: int) -> str:
    return f"stage{stage}-t{t}"


def save(comm: Any, run: Any, step: int) -> None:
    """Write the checkpoint of *step* (collective; CheckpointError on every rank if any rank fails)."""
    cfg = run.cfg
    records, problem = [], None
    try:
        if run.d == 0:
            for st, stage in run.stages.items():
                arrays = {"params": to_host(stage.model.params)}
                arrays.update({f"optimizer.{k}": to_host(v) for k, v in run.state[st].items()})
                path = ck.data_path(cfg.checkpoint_dir, PREFIX, step, _part(st, run.t))
                record, entries = ck.write_arrays(path, arrays)
                records.append((_part(st, run.t), record, entries))
    except (OSError, ValueError, ck.CheckpointError) as exc:
        problem = f"rank {comm.Get_rank()}: writing checkpoint {step}: {exc}"
    gathered = comm.gather((records, problem), root=0)
    if comm.Get_rank() == 0:
        problem = next((p for _, p in gathered if p), None)
        if problem is None:
            try:
                flat = [item for part, _ in gathered for item in part]
                ck.save_manifest(ck.manifest_path(cfg.checkpoint_dir, PREFIX, step), step, [r for _, r, _ in flat],
                                 parts={name: {"file": r["file"], "arrays": e} for name, r, e in flat},
                                 model=signature(cfg, run.bounds))
                ck.prune(cfg.checkpoint_dir, PREFIX, cfg.keep)
            except (OSError, ValueError, ck.CheckpointError) as exc:
                problem = f"rank 0: writing checkpoint {step}'s manifest: {exc}"
    verdict(comm, problem, ck.CheckpointError)


def _newest(cfg: Any) -> dict[str, Any]:
    """Rank 0: the newest valid manifest, or CheckpointError saying why there is none."""
    os.makedirs(cfg.checkpoint_dir, exist_ok=True)
    body, refused = ck.newest_valid(cfg.checkpoint_dir, PREFIX)
    if body is None:
        raise ck.CheckpointError(f"no valid checkpoint in {cfg.checkpoint_dir}"
                                 + (": " + "; ".join(refused) if refused else "")
                                 + "; drop --restart to start afresh")
    return body


def saved_bounds(comm: Any, cfg: Any) -> list[tuple[int, int]] | None:
    """The split (blocks per stage) of the checkpoint a restart will resume, or None (collective).

    ``--balance time`` measures afresh on every run, and timing noise picks
    between equally good splits: a restart takes the checkpoint's split instead.
    """
    bounds = None
    if comm.Get_rank() == 0:
        try:
            model = _newest(cfg).get("model")
            saved = model.get("bounds") if isinstance(model, dict) else None
            if isinstance(saved, list) and all(isinstance(b, list) and len(b) == 2 for b in saved):
                bounds = [(int(a), int(b)) for a, b in saved]
        except (ck.CheckpointError, OSError, ValueError, TypeError):
            bounds = None  # load() reports it
    return comm.bcast(bounds, root=0)


def load(comm: Any, run: Any) -> int:
    """Resume from the newest valid checkpoint of this run's split (collective); its step, or CheckpointError everywhere."""
    cfg = run.cfg
    outcome: Any = None
    if comm.Get_rank() == 0:
        try:
            body = _newest(cfg)
            if body.get("model") != signature(cfg, run.bounds):
                raise ck.CheckpointError(f"{body['path']}: written by another model, split or run "
                                         f"({body.get('model')}); use the options it was written with")
            parts = body.get("parts")
            if not isinstance(parts, dict):
                raise ck.CheckpointError(f"{body['path']}: no 'parts' table")
            outcome = ("ok", body["step"], parts)
        except (ck.CheckpointError, OSError) as exc:
            outcome = ("error", str(exc), None)
    outcome = comm.bcast(outcome, root=0)
    if outcome[0] == "error":
        raise ck.CheckpointError(outcome[1])
    step, parts = outcome[1], outcome[2]
    problem = None
    try:
        for st, stage in run.stages.items():
            name = _part(st, run.t)
            entry = parts.get(name)
            if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
                raise ck.CheckpointError(f"checkpoint step {step} has no part {name}")
            path = ck.data_path(cfg.checkpoint_dir, PREFIX, step, name)
            if entry["file"] != os.path.basename(path):
                raise ck.CheckpointError(f"checkpoint step {step}: part {name} names {entry['file']!r}, "
                                         f"expected {os.path.basename(path)!r}")
            arrays = ck.read_arrays(path, ck.check_entries(entry.get("arrays"), None, path))
            params = arrays.get("params")
            if params is None or params.shape != stage.model.params.shape:
                raise ck.CheckpointError(f"{path}: params do not fit stage {st}")
            stage.model.load_params(params)
            for k, into in run.state[st].items():
                saved = arrays.get(f"optimizer.{k}")
                if saved is None or saved.size != into.size:
                    raise ck.CheckpointError(f"{path}: optimizer.{k} missing or of the wrong size")
                into[...] = run.xp.asarray(saved.reshape(into.shape))  # to the device with --backend cupy
    except (ck.CheckpointError, OSError) as exc:
        problem = str(exc)
    agree(comm, problem, ck.CheckpointError)
    return int(step)
