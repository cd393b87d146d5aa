"""Folders that hold this user's files only (the spool's row data, the JVM's scratch)."""

from __future__ import annotations

import os
from pathlib import Path


def private_directory(path: Path, *, what: str, remedy: str, error: type[Exception]) -> Path:
    """``path`` as a directory only this user can enter, made if missing.

    A directory made by someone else first (a predictable name under a shared
    /tmp) or opened to others is refused with ``error``, naming ``what`` it is
    for and the ``remedy``, not used.
    """
    try:
        path.mkdir(parents=True, mode=0o700, exist_ok=True)
        info = path.stat()
    except OSError as exc:
        raise error(f"cannot create {what} {path}: {exc}") from exc
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise error(
            f"{what} {path} belongs to uid {info.st_uid} with mode "
            f"{info.st_mode & 0o777:o}; it must be this user's ({os.getuid()}) with mode 700: "
            f"remove it, or {remedy}"
        )
    return path
