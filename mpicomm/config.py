"""Settings read from the environment, in one place, each checked with a clear error.

| variable | values | default | effect |
|---|---|---|---|
| ``MPICOMM_CUDA_AWARE`` | ``auto``, ``1``, ``0`` | ``auto`` | whether MPI may be handed device pointers (``auto`` asks the library) |
| ``MPICOMM_TRANSFER`` | ``auto``, ``staged`` | ``auto`` | ``staged`` copies every buffer through reusable host buffers, NumPy included (to exercise the GPU staging path on a CPU machine) |
| ``MPICOMM_CUDA_AWARE_RMA`` | ``0``, ``1`` | ``0`` | expose device arrays in RMA windows directly (many CUDA-aware MPIs support point-to-point but not one-sided on device memory); otherwise through a pinned host mirror |
| ``MPICOMM_DEVICE`` | GPU ordinal | unset | the GPU every rank of this node uses, instead of ``local_rank % visible GPUs`` |
| ``MPICOMM_<COLLECTIVE>_ALGORITHM`` | an algorithm name | ``auto`` | the algorithm a collective uses when the call names none |
| ``MPICOMM_VALIDATE`` | ``1``, ``0`` | ``1`` | before each collective, ranks agree on counts, dtype, op, root and algorithm (four 64-bit words - a digest of the call, a problem flag, a cross-check of v-counts - combined by a butterfly that rides in the algorithm's own messages where its first rounds are one, else runs beside them as 32-byte messages; full descriptions are exchanged only when something differs: :mod:`mpicomm.plan.agreement`); a mismatch, or a bad argument on any rank, raises the same error on every rank. ``0`` skips it: faster, but a mismatch may then hang or corrupt (what is checked either way: :mod:`mpicomm.validate`) |
| ``MPICOMM_REPRODUCIBLE`` | ``0``, ``1`` | ``0`` | reducing collectives (allreduce, reduce, reduce_scatter(_block), scan, exscan; blocking, nonblocking, persistent; the torch backend's too) with ``SUM`` on float32/64 and complex64/128 give a reproducible sum: the same bits for every algorithm, order and rank count (:mod:`mpicomm.reproducible`); the default of each communicator's ``reproducible`` |
| ``MPICOMM_CMA`` | ``auto``, ``0`` | ``auto`` | shared-memory collectives read the peers' ordinary arrays with one copy (``process_vm_readv``) where every rank of the node can; ``0`` copies them through the node's shared scratch instead |
| ``MPICOMM_LANE`` | ``1``, ``0`` | ``1`` | run compiled plans' data steps in the compiled lane (C, without the GIL: :mod:`mpicomm.engine.lane`); ``0`` runs them in the executor's Python loop, for comparison |
| ``MPICOMM_TIMEOUT`` | seconds | unset (off) | hang watchdog: a blocking wait that lasts longer reports the operation (for a collective: count, element type, op, root), the peers it waits for, which ranks never arrived and each rank's last calls, then aborts the job |
| ``MPICOMM_TRACE`` | a file path | unset (off) | write a Chrome trace of every mpicomm call there at exit (:mod:`mpicomm.trace`); its directory must be writable on rank 0 |
| ``MPICOMM_ALGORITHM_MODULES`` | import paths, comma-separated | unset | modules of user algorithms the registry imports (:mod:`mpicomm.registry`) |
| ``MPICOMM_CACHE_DIR`` | a directory | ``$XDG_CACHE_HOME/mpicomm``, else ``~/.cache/mpicomm`` | where ``tune`` saves fits and measured rules |
| ``MPICOMM_TORCH_PROGRESS`` | ``async``, ``sync`` | ``async`` | how the torch backend completes operations (:mod:`mpicomm.torch.work`) |
| ``MPICOMM_TORCH_SET`` | (internal) | unset | the variables :mod:`mpicomm.torch.launch` set in a parent process |
| ``MPICOMM_LAUNCH``, ``MPICOMM_NTASKS``, ``MPICOMM_RUN_DIR``, ``MPICOMM_SLURM_DIR`` | | | read by the scripts in ``jobs/`` (see ``jobs/README.md``) |
| ``MPICOMM_SLOW_TESTS``, ``MPICOMM_TEST_*`` | | | read by the test suite (``python -m tests``) |

Every ``MPICOMM_*`` variable is checked when a ``Comm`` is made
(:func:`problems`): a name not in this table (a misspelling, say
``MPICOMM_VALIDAT``), a value a variable does not take, an algorithm the
registry does not have, an algorithm module that does not import, or a trace
file that cannot be written raise a ValueError there, on every rank (the
ranks exchange what each found, so a setting wrong on one rank only is
refused everywhere), naming the variable, the rank and the valid values.

``MPICOMM_VALIDATE``, ``MPICOMM_REPRODUCIBLE`` and ``MPICOMM_<COLLECTIVE>_ALGORITHM`` change the
protocol: ranks that differ on them run different message sequences (one
validates, another does not; one runs ring, another recursive doubling) and
would hang. Creating a ``Comm`` compares them across its ranks (one small
allgather, see :func:`protocol` and :func:`protocol_mismatch`) and raises the
same error on every rank when they differ. The others (device, transfer path,
timeout, trace) only change what a rank does locally.

Values are read when used, so a test or a program may change them at run time
(then on every rank alike: a change after a ``Comm`` exists is not compared).
Reading one costs a dictionary look-up (collectives read several per call), and
a value already parsed once is not parsed again.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable

__all__ = [
    "raw", "choice", "optional_int", "cuda_aware_setting", "cuda_aware_rma", "transfer_mode", "device_override",
    "algorithm_setting", "validate", "reproducible", "cma", "timeout", "torch_progress", "problems", "refusal", "KNOWN",
    "protocol", "protocol_mismatch",
]


_ENVIRON = os.environ
# The process environment as os.environ keeps it (a dict of encoded names and values): one look-up per read,
# instead of os.environ's encode-look-up-decode. Changes made through os.environ (monkeypatch.setenv...) land
# in it too; where os.environ is not the usual mapping (replaced, or another platform), it is read plainly.
_DATA: dict | None = getattr(_ENVIRON, "_data", None)
_ENCODE = getattr(_ENVIRON, "encodekey", None)
_DECODE = getattr(_ENVIRON, "decodevalue", None)
_FAST = _DATA is not None and _ENCODE is not None and _DECODE is not None
_KEYS: dict[str, object] = {}
_PARSED: dict[tuple, object] = {}  # (variable, raw value, ...) -> parsed value, for values read before


def raw(name: str) -> str | None:
    """Environment variable *name* as set, or None (cheap: collectives read several per call)."""
    if _FAST and os.environ is _ENVIRON:
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS[name] = _ENCODE(name)  # type: ignore[misc]
        value = _DATA.get(key)  # type: ignore[union-attr]
        return None if value is None else _DECODE(value)  # type: ignore[misc]
    return os.environ.get(name)


def choice(name: str, allowed: tuple[str, ...], default: str) -> str:
    """Return environment variable *name*, which must be one of *allowed*."""
    value = raw(name)
    if not value:  # the common case, on every message: keep it cheap
        return default
    known = _PARSED.get((name, value, allowed))
    if known is not None:
        return known  # type: ignore[return-value]
    parsed = value.strip().lower() or default
    if parsed not in allowed:
        raise ValueError(
            f"environment variable {name}={value!r} is not one of "
            f"{', '.join(allowed)}; set it to one of those or unset it"
        )
    if len(_PARSED) > 256:
        _PARSED.clear()
    _PARSED[(name, value, allowed)] = parsed
    return parsed


def optional_int(name: str) -> int | None:
    """Return environment variable *name* as a non-negative int, or None when unset."""
    value = (raw(name) or "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ValueError(
            f"environment variable {name}={value!r} is not a non-negative integer; fix or unset it"
        )
    return number


def cuda_aware_setting() -> bool | None:
    """``MPICOMM_CUDA_AWARE``: True/False when forced, None to ask the MPI library."""
    value = choice("MPICOMM_CUDA_AWARE", ("auto", "1", "0", "yes", "no", "true", "false"), "auto")
    if value == "auto":
        return None
    return value in ("1", "yes", "true")


def cuda_aware_rma() -> bool:
    """``MPICOMM_CUDA_AWARE_RMA``: whether device arrays may back RMA windows directly."""
    return choice("MPICOMM_CUDA_AWARE_RMA", ("0", "1"), "0") == "1"


def lane() -> bool:
    """``MPICOMM_LANE``: whether compiled plans run their data steps in the compiled lane (read once, at import)."""
    return choice("MPICOMM_LANE", ("1", "0"), "1") == "1"


def transfer_mode() -> str:
    """``MPICOMM_TRANSFER``: ``auto`` or ``staged``."""
    return choice("MPICOMM_TRANSFER", ("auto", "staged"), "auto")


def device_override() -> int | None:
    """``MPICOMM_DEVICE``: the GPU ordinal forced for this process, if any."""
    return optional_int("MPICOMM_DEVICE")


_ALGORITHM_VARIABLES: dict[str, str] = {}


def algorithm_setting(collective: str) -> str | None:
    """``MPICOMM_<COLLECTIVE>_ALGORITHM``, or None when unset."""
    name = _ALGORITHM_VARIABLES.get(collective)
    if name is None:
        name = _ALGORITHM_VARIABLES[collective] = f"MPICOMM_{collective.upper()}_ALGORITHM"
    value = raw(name)
    return (value.strip() or None) if value else None


_YES = ("1", "yes", "true", "on")


def validate() -> bool:
    """``MPICOMM_VALIDATE``: whether collectives check their arguments across ranks first (default on)."""
    value = raw("MPICOMM_VALIDATE")
    if not value:
        return True
    known = _PARSED.get(("validate", value))
    if known is None:
        known = _PARSED[("validate", value)] = choice(
            "MPICOMM_VALIDATE", ("1", "0", "yes", "no", "true", "false", "on", "off"), "1") in _YES
    return known  # type: ignore[return-value]


def reproducible() -> bool:
    """``MPICOMM_REPRODUCIBLE``: whether a communicator's reducing collectives sum reproducibly by default."""
    return choice("MPICOMM_REPRODUCIBLE", ("0", "1", "no", "yes", "false", "true", "off", "on"), "0") in _YES


def cma() -> bool:
    """``MPICOMM_CMA``: whether shared-memory collectives may read peers' memory directly (default ``auto``)."""
    return choice("MPICOMM_CMA", ("auto", "0", "1", "off", "on"), "auto") not in ("0", "off")


def timeout() -> float | None:
    """``MPICOMM_TIMEOUT``: the hang watchdog's limit in seconds, or None (off)."""
    value = raw("MPICOMM_TIMEOUT")
    if not value or not value.strip():
        return None
    known = _PARSED.get(("timeout", value))
    if known is not None:
        return known  # type: ignore[return-value]
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(
            f"environment variable MPICOMM_TIMEOUT={value!r} is not a positive number of seconds; fix or unset it"
        )
    _PARSED[("timeout", value)] = seconds
    return seconds


def torch_progress() -> str:
    """``MPICOMM_TORCH_PROGRESS``: ``"async"`` (the default; ``auto`` and ``thread``, older names, too) or ``"sync"``."""
    value = choice("MPICOMM_TORCH_PROGRESS", ("async", "sync", "auto", "thread"), "async")
    return "sync" if value == "sync" else "async"


def protocol() -> tuple[tuple[str, str], ...]:
    """The settings every rank must share (they change which messages a collective sends), as (variable, value).

    ``MPICOMM_VALIDATE`` and ``MPICOMM_REPRODUCIBLE`` as parsed (``1``/``0``, so ``on`` and ``1`` agree)
    and every ``MPICOMM_<COLLECTIVE>_ALGORITHM`` that is set; read from the
    environment as it is now.
    """
    found = [("MPICOMM_VALIDATE", "1" if validate() else "0"), ("MPICOMM_REPRODUCIBLE", "1" if reproducible() else "0")]
    for name in sorted(os.environ):
        if name.startswith("MPICOMM_") and name.endswith("_ALGORITHM") and len(name) > len("MPICOMM__ALGORITHM"):
            value = os.environ[name].strip()
            if value and value.lower() != "auto":
                found.append((name, value))
    modules = (raw("MPICOMM_ALGORITHM_MODULES") or "").strip()
    if modules:  # algorithms some ranks have and others not: the same name would run different schedules
        found.append(("MPICOMM_ALGORITHM_MODULES", modules))
    return tuple(found)


def protocol_mismatch(every: list) -> str | None:
    """A message naming each protocol setting that differs among the ranks' :func:`protocol` tuples, or None."""
    names = sorted({name for settings in every for name, _ in settings})
    parts = []
    for name in names:
        values = [dict(settings).get(name, "unset") for settings in every]
        if len(set(values)) > 1:
            groups: dict[str, list[int]] = {}
            for rank, value in enumerate(values):
                groups.setdefault(value, []).append(rank)
            shown = ", ".join(f"{value!r} on rank(s) {', '.join(map(str, ranks[:8]))}{', …' if len(ranks) > 8 else ''}"
                              for value, ranks in groups.items())
            parts.append(f"{name}: {shown}")
    if not parts:
        return None
    return ("ranks disagree on settings that change the collectives' messages (they would hang or mix up calls): "
            + "; ".join(parts) + ". Set them alike on every rank (e.g. export them before mpiexec), or unset them")


#: Every ``MPICOMM_*`` name the package, its applications, job scripts and tests read (the module docstring's
#: table), besides ``MPICOMM_<COLLECTIVE>_ALGORITHM`` and the test suite's ``MPICOMM_TEST_*``.
KNOWN = frozenset({
    "MPICOMM_CUDA_AWARE", "MPICOMM_TRANSFER", "MPICOMM_CUDA_AWARE_RMA", "MPICOMM_DEVICE", "MPICOMM_VALIDATE",
    "MPICOMM_REPRODUCIBLE",
    "MPICOMM_CMA", "MPICOMM_LANE", "MPICOMM_TIMEOUT", "MPICOMM_TRACE", "MPICOMM_ALGORITHM_MODULES", "MPICOMM_CACHE_DIR",
    "MPICOMM_TORCH_PROGRESS", "MPICOMM_TORCH_SET", "MPICOMM_LAUNCH", "MPICOMM_NTASKS", "MPICOMM_RUN_DIR",
    "MPICOMM_SLURM_DIR", "MPICOMM_SLOW_TESTS",
})
_TEST_PREFIX = "MPICOMM_TEST_"
_ALGORITHM_SUFFIX = "_ALGORITHM"
_WRITABLE: dict[str, str | None] = {}  # directory -> why a file cannot be written there (None: it can)


def _algorithm_collective(name: str) -> str | None:
    """``"allreduce"`` for ``MPICOMM_ALLREDUCE_ALGORITHM``; None for a name of another form."""
    if name.startswith("MPICOMM_") and name.endswith(_ALGORITHM_SUFFIX) and len(name) > len("MPICOMM__ALGORITHM"):
        return name[len("MPICOMM_"):-len(_ALGORITHM_SUFFIX)].lower()
    return None


def _unwritable(directory: str) -> str | None:
    """Why a file cannot be created in *directory* (tried: permissions alone do not tell for root), or None."""
    if directory in _WRITABLE:
        return _WRITABLE[directory]
    probe = os.path.join(directory, f".mpicomm-probe.{os.getpid()}")
    why = None
    try:
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        why = exc.strerror or str(exc)
    _WRITABLE[directory] = why
    return why


def problems(collectives: tuple[str, ...] = (), algorithms: Callable[[str], list[str]] | None = None,
             import_modules: Callable[[str], object] | None = None, writes_trace: bool = True) -> list[str]:
    """What is wrong with this process's ``MPICOMM_*`` settings, one line each (empty: nothing).

    Every variable of the environment whose name starts with ``MPICOMM_``
    must be :data:`KNOWN` (or ``MPICOMM_<COLLECTIVE>_ALGORITHM`` with
    *collectives* naming the collectives, or ``MPICOMM_TEST_*``); every value
    with a fixed set must be one of it; an algorithm setting must name one of
    ``algorithms(collective)``; the modules ``MPICOMM_ALGORITHM_MODULES`` names
    must import (``import_modules(value)``, an ImportError is a problem); ``MPICOMM_TRACE``'s directory
    must take a file when *writes_trace* (this rank writes the trace).
    """
    found: list[str] = []
    for reader in (cuda_aware_setting, cuda_aware_rma, transfer_mode, device_override, validate, reproducible, cma,
                   lane, timeout, torch_progress):  # every setting with a fixed set of values
        try:
            reader()
        except ValueError as exc:
            found.append(str(exc))
    names = sorted(name for name in os.environ if name.startswith("MPICOMM_"))
    spelled = sorted(KNOWN | {f"MPICOMM_{c.upper()}{_ALGORITHM_SUFFIX}" for c in collectives})
    for name in names:
        collective = _algorithm_collective(name)
        if name in KNOWN or name.startswith(_TEST_PREFIX):
            continue
        if collective is not None and collective in collectives:
            value = os.environ[name].strip()
            if not value or value == "auto" or algorithms is None:
                continue
            try:
                known = algorithms(collective)
            except ImportError as exc:
                found.append(str(exc))
                continue
            if value not in known:
                close = difflib.get_close_matches(value, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                found.append(f"environment variable {name}={value!r} is not an algorithm of {collective}{hint}; "
                             f"registered: {', '.join(known)}, or auto; fix or unset it")
            continue
        close = difflib.get_close_matches(name, spelled, n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        if collective is not None:
            found.append(f"environment variable {name}: {collective!r} is not a collective{hint}; "
                         f"MPICOMM_<COLLECTIVE>_ALGORITHM takes one of {', '.join(collectives)}; fix or unset it")
        else:
            found.append(f"environment variable {name} is not an mpicomm setting{hint}; unset it (the settings are "
                         f"listed in mpicomm.config: python -c 'import mpicomm.config as c; help(c)')")
    modules = (raw("MPICOMM_ALGORITHM_MODULES") or "").strip()
    if modules and import_modules is not None:
        try:
            import_modules(modules)
        except ImportError as exc:
            if str(exc) not in found:
                found.append(str(exc))
    trace = (raw("MPICOMM_TRACE") or "").strip()
    if trace and writes_trace:
        directory = os.path.dirname(os.path.abspath(trace)) or "."
        why = _unwritable(directory)
        if why is not None:
            found.append(f"environment variable MPICOMM_TRACE={trace!r}: cannot write the trace file in "
                         f"{directory} ({why}); name a file in a writable directory, or unset it")
    return found


def refusal(every: list[list[str]]) -> str | None:
    """One message naming each rank's :func:`problems` (*every*: all ranks' lists, the same on every rank), or None."""
    having: dict[str, list[int]] = {}
    for rank, lines in enumerate(every):
        for line in lines:
            having.setdefault(line, []).append(rank)
    if not having:
        return None
    parts = [f"{text} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks[:8]))}"
             f"{', …' if len(ranks) > 8 else ''})" for text, ranks in having.items()]
    return "mpicomm settings refused: " + "; ".join(parts)


def describe_cpu() -> str:
    """``"<CPU model> (<arch>), <n> cores, <OS>, Python <version>"``: the machine line of benchmark reports."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    return f"{cpu} ({platform.machine()}), {os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}"
