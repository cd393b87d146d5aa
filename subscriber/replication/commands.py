"""Replication commands and pgoutput options, built from the server version.

Pure: takes what the user asked for and the publisher's ``server_version``
number, returns command text, or raises ``UnsupportedFeatureError`` naming
the option and the version that would support it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Final

from subscriber.replication.errors import UnsupportedFeatureError
from subscriber.replication.lsn import Lsn

_SLOT_NAME: Final = re.compile(r"^[a-z0-9_]{1,63}$")


class SnapshotAction(Enum):
    NOTHING = "nothing"
    EXPORT = "export"
    USE = "use"


class Streaming(Enum):
    OFF = "off"
    ON = "on"
    PARALLEL = "parallel"


def _major(server_version: int) -> int:
    return server_version // 10000


def proto_version_for(server_version: int) -> int:
    """What PostgreSQL's own subscriber asks for: 4, 3, 2 or 1 for 16+, 15, 14, older."""
    major = _major(server_version)
    if major >= 16:
        return 4
    if major >= 15:
        return 3
    if major >= 14:
        return 2
    return 1


def check_slot_name(name: str) -> str:
    """Slot names are lower-case letters, digits and underscores, at most 63."""
    if not _SLOT_NAME.match(name):
        raise ValueError(
            f"invalid replication slot name {name!r}: use lower-case letters, digits and "
            "underscores, at most 63 characters"
        )
    return name


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def create_slot_command(
    server_version: int,
    name: str,
    *,
    temporary: bool = False,
    snapshot: SnapshotAction = SnapshotAction.NOTHING,
    two_phase: bool = False,
    failover: bool = False,
) -> str:
    check_slot_name(name)
    major = _major(server_version)
    head = f"CREATE_REPLICATION_SLOT {name}{' TEMPORARY' if temporary else ''} LOGICAL pgoutput"
    if failover and major < 17:
        raise UnsupportedFeatureError(
            f"failover slots need PostgreSQL 17 or newer; the publisher runs {major}"
        )
    if two_phase and major < 15:
        raise UnsupportedFeatureError(
            f"two_phase needs PostgreSQL 15 or newer; the publisher runs {major}"
        )
    if major < 15:
        legacy = {
            SnapshotAction.NOTHING: "NOEXPORT_SNAPSHOT",
            SnapshotAction.EXPORT: "EXPORT_SNAPSHOT",
            SnapshotAction.USE: "USE_SNAPSHOT",
        }[snapshot]
        return f"{head} {legacy}"
    options = [f"SNAPSHOT '{snapshot.value}'"]
    if two_phase:
        options.append("TWO_PHASE")
    if failover:
        options.append("FAILOVER")
    return f"{head} ({', '.join(options)})"


def drop_slot_command(name: str, *, wait: bool = True) -> str:
    return f"DROP_REPLICATION_SLOT {check_slot_name(name)}{' WAIT' if wait else ''}"


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """What a subscription asks of pgoutput (its pgoutput options)."""

    publications: tuple[str, ...]
    binary: bool = False
    messages: bool = False
    streaming: Streaming = Streaming.OFF
    two_phase: bool = False
    origin: str = "any"  # any | none
    proto_version: int | None = None  # None: negotiated from the server version
    # The messages of pgsub's DDL event triggers (apply.schema_changes.ddl): logical messages asked
    # for on
    # a PostgreSQL 14+ publisher even without ``messages``.
    schema_changes: bool = False

    def negotiated_proto(self, server_version: int) -> int:
        return self.proto_version or proto_version_for(server_version)

    def pgoutput_options(self, server_version: int) -> list[tuple[str, str]]:
        """The option list for START_REPLICATION, checked against the server."""
        if not self.publications:
            raise ValueError("a subscription needs at least one publication")
        major = _major(server_version)
        proto = self.negotiated_proto(server_version)
        if proto > proto_version_for(server_version):
            raise UnsupportedFeatureError(
                f"pgoutput protocol version {proto} is not offered by PostgreSQL {major}"
            )

        def need(feature: str, min_major: int, min_proto: int = 1) -> None:
            if major < min_major:
                raise UnsupportedFeatureError(
                    f"{feature} needs a PostgreSQL {min_major}+ publisher; it runs {major}"
                )
            if proto < min_proto:
                raise UnsupportedFeatureError(
                    f"{feature} needs pgoutput protocol {min_proto}+, asked for {proto}"
                )

        options = [
            ("proto_version", str(proto)),
            ("publication_names", ",".join(quote_ident(p) for p in self.publications)),
        ]
        if self.binary:
            need("binary", 14)
            options.append(("binary", "true"))
        if self.messages:
            need("messages", 14)
            options.append(("messages", "true"))
        elif self.schema_changes and major >= 14:
            options.append(("messages", "true"))
        if self.streaming is Streaming.ON:
            need("streaming = on", 14, 2)
            options.append(("streaming", "on"))
        elif self.streaming is Streaming.PARALLEL:
            need("streaming = parallel", 16, 4)
            options.append(("streaming", "parallel"))
        if self.two_phase:
            need("two_phase", 15, 3)
            options.append(("two_phase", "on"))
        if self.origin != "any":
            need("origin = none", 16)
            options.append(("origin", self.origin))
        return options


def start_replication_command(slot: str, start: Lsn, options: list[tuple[str, str]]) -> str:
    rendered = ", ".join(f"{quote_ident(k)} {quote_literal(v)}" for k, v in options)
    return f"START_REPLICATION SLOT {check_slot_name(slot)} LOGICAL {start} ({rendered})"
