"""Settings read from the environment, in one place, each checked with a clear error.

| variable | values | default | effect |
|---|---|---|---|
| ``MPICOMM_CUDA_AWARE`` | ``auto``, ``1``, ``0`` | ``auto`` | whether MPI may be handed device pointers (``auto`` asks the library) |
| ``MPICOMM_TRANSFER`` | ``auto``, ``staged`` | ``auto`` | ``staged`` copies every buffer through reusable host buffers, NumPy included (to exercise the GPU staging path on a CPU machine) |
| ``MPICOMM_CUDA_AWARE_RMA`` | ``0``, ``1`` | ``0`` | expose device arrays in RMA windows directly (many CUDA-aware MPIs support point-to-point but not one-sided on device memory); otherwise through a pinned host mirror |
| ``MPICOMM_DEVICE`` | GPU ordinal | unset | the GPU every rank of this node uses, instead of ``local_rank % visible GPUs`` |
| ``MPICOMM_<COLLECTIVE>_ALGORITHM`` | an algorithm name | ``auto`` | the algorithm a collective uses when the call names none |
| ``MPICOMM_VALIDATE`` | ``1``, ``0`` | ``1`` | before each collective, ranks agree on counts, dtype, op, root and algorithm (one 32-byte allreduce of a digest; the full descriptions are exchanged only when something differs); a mismatch, or a bad argument on any rank, raises the same error on every rank. ``0`` skips it: faster, but a mismatch may then hang or corrupt (what is checked either way: :mod:`mpicomm.validate`) |
| ``MPICOMM_CMA`` | ``auto``, ``0`` | ``auto`` | shared-memory collectives read the peers' ordinary arrays with one copy (``process_vm_readv``) where every rank of the node can; ``0`` copies them through the node's shared scratch instead |
| ``MPICOMM_TIMEOUT`` | seconds | unset (off) | hang watchdog: a blocking wait that lasts longer reports the operation (for a collective: count, element type, op, root), the peers it waits for, which ranks never arrived and each rank's last calls, then aborts the job |

``MPICOMM_VALIDATE`` and ``MPICOMM_<COLLECTIVE>_ALGORITHM`` change the
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

import os

__all__ = [
    "raw", "choice", "optional_int", "cuda_aware_setting", "cuda_aware_rma", "transfer_mode", "device_override", "algorithm_setting", "validate", "cma", "timeout", "check",
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


def protocol() -> tuple[tuple[str, str], ...]:
    """The settings every rank must share (they change which messages a collective sends), as (variable, value).

    ``MPICOMM_VALIDATE`` as parsed (``1``/``0``, so ``on`` and ``1`` agree)
    and every ``MPICOMM_<COLLECTIVE>_ALGORITHM`` that is set; read from the
    environment as it is now.
    """
    found = [("MPICOMM_VALIDATE", "1" if validate() else "0")]
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


def check() -> None:
    """Read every setting once, so a bad value fails at start-up rather than on first use."""
    cuda_aware_setting()
    cuda_aware_rma()
    transfer_mode()
    device_override()
    validate()
    cma()
    timeout()


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
