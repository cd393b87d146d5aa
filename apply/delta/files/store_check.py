"""What the daemon asks of an object store before it writes a row there.

Every commit pgsub makes on object storage, its own and delta-rs's, takes
put-if-absent from a conditional PUT (``If-None-Match: *``): a store that
ignores the header would let two writers make one version, and a batch
would vanish under another. So before anything else ``check_store`` puts
one probe object twice under ``<warehouse>/_pgsub/probe/``: the second PUT
must be refused (412), else the daemon stops with an error saying so. The
same two requests tell apart what a user gets wrong first - an endpoint
that does not answer, credentials the store refuses, a bucket that is not
there - each a ``StoreError`` naming the warehouse and what to fix, not a
Java stack trace retried for ever.

``round_trip`` times the store's answer (the fastest of a few HEADs), from
which a batch's writers are counted (``writers_for``).
"""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Final

import structlog

from apply.core.errors import TargetTableError
from apply.delta.files.storage import Storage, is_object_store, storage_for

log = structlog.get_logger(__name__)

# The store's refusal of the credentials, in an error's text: the status code as a word
# (not digits inside a name or a port), or S3's own codes.
_REFUSED: Final = re.compile(
    r"(?<![0-9A-Za-z])40[13](?![0-9A-Za-z])|Forbidden|InvalidAccessKeyId|SignatureDoesNotMatch"
)
# Tables of a batch written at once (``writers``): on a local disk; in an object store whose
# round trip was not measured; at most.
LOCAL_WRITERS: Final = 4
BUCKET_WRITERS: Final = 16
MAX_WRITERS: Final = 32
# A table's batch in an object store: its Python work (keys looked up, a Parquet file, a
# vector, a commit: about 5 ms here, under Python's lock) and two round trips in sequence
# (the two files' PUTs, the commit's; the log's HEADs are answered meanwhile:
# ``OpenTable.ask_latest``).
TABLE_CPU: Final = 0.005
TABLE_ROUND_TRIPS: Final = 2


def writers_for(round_trip: float | None) -> int:
    """Tables of a batch written at once in an object store answering in ``round_trip``
    seconds: enough that while each waits for its requests the others keep the CPU busy,
    and no more (more threads than that only contend for Python's lock: 200 tables at
    1,000/s in a bucket on this machine, lag p99 4.45 s with 4 writers, 6.02 with 8, 6.76
    with 16). A store 1 ms away gets ``LOCAL_WRITERS``, S3's 20-50 ms 9-21."""
    if round_trip is None:
        return BUCKET_WRITERS
    wanted = math.ceil(round(1 + TABLE_ROUND_TRIPS * round_trip / TABLE_CPU, 6))
    return max(LOCAL_WRITERS, min(MAX_WRITERS, wanted))


class StoreError(TargetTableError):
    """The warehouse's object store cannot be used as configured."""


def check_store(warehouse: str, what: str = "pgsub") -> None:
    """Raise a ``StoreError`` unless the object store under ``warehouse`` answers, takes the
    configured credentials, has the bucket, and refuses a second PUT of one name. ``what``:
    who asks (a subscription, a command), for the message. A local folder needs nothing."""
    if not is_object_store(warehouse):
        return
    import obstore
    from obstore.store import from_url

    storage = storage_for(warehouse)
    probe = f"{warehouse.rstrip('/')}/_pgsub/probe"
    config, client = storage.obstore_config()
    store = from_url(probe, config=config, client_options=client)  # type: ignore[call-overload]
    name = f"{uuid.uuid4()}.probe"
    try:
        obstore.put(store, name, b"pgsub probe", mode="create")
        try:
            obstore.put(store, name, b"pgsub probe, again", mode="create")
        except obstore.exceptions.AlreadyExistsError:
            pass  # refused, as it must be
        else:
            raise StoreError(
                f"{what}: the object store of warehouse {warehouse} does not honour "
                "conditional PUTs (If-None-Match: *): it took a second PUT of one name. pgsub "
                "commits to Delta tables by conditional PUT, so that no two writers make one "
                "version; use a store that supports them (AWS S3, and most S3-compatible "
                "servers: MinIO, versitygw, Ceph RGW 17+)"
            )
        obstore.delete(store, name)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - each store error, said in the user's terms
        raise StoreError(_explained(exc, warehouse, storage, what)) from None
    log.info("object store checked", warehouse=warehouse, conditional_put=True)


def _explained(exc: Exception, warehouse: str, storage: Storage, what: str) -> str:
    """What the store's answer to the probe says to fix (never a credential)."""
    import obstore

    text = str(exc)
    where = storage.endpoint or "the cloud's default endpoint"
    if isinstance(exc, obstore.exceptions.NotFoundError) or "NoSuchBucket" in text:
        return (
            f"{what}: the bucket of warehouse {warehouse} does not exist at {where}: "
            "create it, or correct the warehouse URL"
        )
    # Asked first: no answer is no refusal, whatever digits the request's URL holds (the
    # probe's name is a UUID, and about one in 60 holds "401" or "403").
    if any(word in text for word in ("error sending request", "Connection refused", "dns")):
        return (
            f"{what}: the object store of warehouse {warehouse} does not answer at {where}: "
            "check storage.endpoint (scheme, host, port) and that the store runs"
        )
    if isinstance(
        exc, obstore.exceptions.PermissionDeniedError | obstore.exceptions.UnauthenticatedError
    ) or _REFUSED.search(text):
        return (
            f"{what}: the object store at {where} refused the credentials for warehouse "
            f"{warehouse} (HTTP 401/403): set storage.access_key_id_file and "
            "storage.secret_access_key_file, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "to a key that may read and write the bucket"
        )
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"{what}: cannot use the object store of warehouse {warehouse} at {where}: {first}"


def round_trip(warehouse: str, tries: int = 3) -> float | None:
    """Seconds the object store under ``warehouse`` takes to answer a small request: the
    fastest of ``tries`` HEADs of a name that is not there (the first pays the connection).
    None: it did not answer them (the batches' own requests say why)."""
    import obstore
    from obstore.store import from_url

    storage = storage_for(warehouse)
    config, client = storage.obstore_config()
    root = f"{warehouse.rstrip('/')}/_pgsub"
    store = from_url(root, config=config, client_options=client)  # type: ignore[call-overload]
    fastest = math.inf
    for _ in range(tries):
        started = time.monotonic()
        try:
            obstore.head(store, "round-trip")
        except FileNotFoundError:
            pass  # the answer expected
        except Exception:  # noqa: BLE001 - no figure; the writer count falls back
            return None
        fastest = min(fastest, time.monotonic() - started)
    return fastest
