"""JSON-lines logs written by processes that may be killed mid-line."""

from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """Every complete record of ``path`` ([] if it does not exist); a line cut short by a
    kill, or otherwise not JSON, is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
