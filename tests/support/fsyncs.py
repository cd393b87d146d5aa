"""The files and folders a test's code fsyncs, recorded as it runs."""

from __future__ import annotations

import os

import pytest


def recorded_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the files and folders fsynced from now on, in order (each still
    fsynced)."""
    done: list[str] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        done.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    return done
