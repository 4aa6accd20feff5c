"""Test helper: write a checkpoint manifest whose own checksum is right, as someone able to edit the directory can.

Why: the manifest's checksum catches damage and careless edits; a deliberate
edit recomputes it, and must still be refused by the field checks. Tests use
:func:`forge` to reach those checks. The checksum is computed here
independently of :mod:`apps.checkpoint` (SHA-256 of the canonical JSON body
without the ``manifest_sha256`` key), so the tests also pin the format.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

KEY = "manifest_sha256"


def forge(path: str, body: dict[str, Any]) -> None:
    """Write *body* (minus ``path`` and any old checksum) to *path* with a right ``manifest_sha256``."""
    body = {k: v for k, v in body.items() if k not in (KEY, "path")}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    with open(path, "w") as f:
        json.dump({**body, KEY: digest}, f)


def load(path: str) -> dict[str, Any]:
    """A manifest's JSON body, as it is on disk."""
    with open(path) as f:
        return json.load(f)
