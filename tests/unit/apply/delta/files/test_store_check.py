"""What the start's probe of an object store says to fix (apply/delta/files/store_check.py)."""

from __future__ import annotations

import socket

import obstore
import pytest
from obstore.store import from_url

from apply.delta.files.storage import Storage
from apply.delta.files.store_check import _explained


def test_a_store_that_does_not_answer_is_said_so_whatever_digits_its_request_holds() -> None:
    """A refused connection is an endpoint to check, even when the probe's random name (a
    UUID) holds "403" or "401": read as HTTP 403, it once sent the user to fix credentials
    the store never saw (a flaky `test_a_store_pgsub_cannot_use_stops_it_at_once...`)."""
    unanswered = socket.socket()
    unanswered.bind(("127.0.0.1", 0))  # held, never listened on: refused
    try:
        endpoint = f"http://127.0.0.1:{unanswered.getsockname()[1]}"
        storage = Storage(
            endpoint=endpoint, region="us-east-1", path_style=True, access_key_id="k",
            secret_access_key="s",
        )  # fmt: skip
        config, client = storage.obstore_config()
        store = from_url("s3://lake/wh/_pgsub/probe", config=config, client_options=client)  # type: ignore[call-overload]
        with pytest.raises(Exception) as refused:
            obstore.put(store, "4013a403-0403-4401-a403-000000000401.probe", b"x", mode="create")
    finally:
        unanswered.close()
    assert "403" in str(refused.value)
    said = _explained(refused.value, "s3a://lake/wh", storage, "sub1")
    assert said.startswith("sub1: the object store of warehouse s3a://lake/wh does not answer at")
    assert endpoint in said and "credentials" not in said
