"""The protocol contract, generated from the Rust ``forkbox-queue`` crate.

``schema.json`` beside this module is the output of ``forkbox schema`` (a test in
``forkbox-queue`` fails when it drifts from the code). It carries the job's fields, the limits
and their ranges, the defaults, the key layout, the statuses and the enqueue script, so this
package submits jobs exactly as the Rust clients do and checks them as the workers will.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

__all__ = ["SCHEMA", "ENQUEUE_LUA", "JOB_STATE_LUA", "LIMIT_RANGES", "key"]

SCHEMA: Dict[str, Any] = json.loads((Path(__file__).parent / "schema.json").read_text(encoding="utf-8"))

#: The script every client runs to add a job: idempotency marker, ``vetted``, batch ``total``.
ENQUEUE_LUA: str = SCHEMA["scripts"]["enqueue"]

#: The read-only script that says where a job is: queued, running, finished or unknown.
JOB_STATE_LUA: str = SCHEMA["scripts"]["job_state"]

#: limit name -> (min, max), inclusive.
LIMIT_RANGES: Dict[str, Tuple[int, int]] = {x["name"]: (x["min"], x["max"]) for x in SCHEMA["limits"]}


def key(which: str, queue: str, **parts: str) -> str:
    """The key ``which`` of the layout for ``queue``, e.g. ``key("result", "q", id="j1")``."""
    template: str = SCHEMA["keys"][which]
    out = template.replace("{Q}", "{" + queue + "}", 1)
    for part, value in parts.items():
        out = out.replace(f"<{part}>", value)
    return out


def statuses() -> List[str]:
    return list(SCHEMA["statuses"])
