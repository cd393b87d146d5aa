"""What a Delta table's log says about its commits: their operations, their writers."""

from __future__ import annotations

import json
from pathlib import Path


def operations(table: Path) -> list[str]:
    """Each commit's operation, oldest first ("MERGE", "WRITE", ...)."""
    return [
        str(json.loads(line)["commitInfo"].get("operation"))
        for commit in sorted((table / "_delta_log").glob("*.json"))
        for line in commit.read_text().splitlines()
        if "commitInfo" in json.loads(line)
    ]


def writers(table: Path) -> list[str]:
    """The engine of each commit of the table, oldest first ("delta-rs", "Spark", or "pgsub"
    for the commits of its own overwrites)."""
    engines = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info is not None:
                client = str(info.get("clientVersion") or info.get("engineInfo") or "")
                if client == "pgsub":
                    engines.append("pgsub")
                else:
                    engines.append("delta-rs" if client.startswith("delta-rs") else "Spark")
    return engines
