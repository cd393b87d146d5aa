"""Headless Chromium (Debian's) for tests of the status page: the DOM after its scripts ran,
and a screenshot to look at."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# What a closed network needs: no background fetches, no updates, no sync.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        raise AssertionError("chromium is not installed: run `make tools` (make test does)")
    return found


def rendered(url: str, profile: Path, *, wait_ms: int = 5000) -> str:
    """The page's DOM once its scripts had ``wait_ms`` of (virtual) time."""
    result = subprocess.run(
        [
            chromium(),
            *_FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={wait_ms}",
            "--dump-dom",
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout


def screenshot(url: str, profile: Path, path: Path, *, wait_ms: int = 5000) -> Path:
    subprocess.run(
        [
            chromium(),
            *_FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={wait_ms}",
            "--window-size=1200,800",
            f"--screenshot={path}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return path
