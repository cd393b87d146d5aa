"""Delta's deletion vectors, read and written by pgsub (Delta's protocol, "Deletion Vectors").

A deletion vector marks rows of one data file as deleted, by their position
in the file. pgsub writes them for a big table's batch itself
(``apply.delta.writer.vector_write``) and reads the ones other writers (Spark's
MERGE, DELETE) left. The formats, as the protocol and Spark spell them:

- the bitmap: ``RoaringBitmapArray`` - the magic number 1681511377, the
  count of 32-bit bitmaps, then each one's high 32 bits and its portable
  Roaring serialization (array, bitset and run containers), little-endian;
- the file ``deletion_vector_<uuid>.bin``: a format byte (1), then per
  vector its size (4 bytes, big-endian), the bitmap and the bitmap's CRC-32
  (big-endian). A descriptor names the file by its UUID in Z85 (20
  characters after an optional folder prefix) and the vector's offset in it;
- ``storageType`` ``i``: the bitmap itself in Z85, in the log; ``p``: an
  absolute path.

Spark writes the bitmap in the portable format; the native one (the magic
number 1681511376, a 32-bit count, each bitmap with its size and no key)
is read too, as Delta's readers do. A vector pgsub cannot read - a format
it does not know, a damaged file, a wrong checksum - is a
``DeletionVectorError``, and the batch then takes Spark's path.

Pure but for ``write_file`` and ``read``; positions are NumPy ``uint64``.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from apply.delta.files.store import canonical

if TYPE_CHECKING:
    from apply.delta.files.store import TableStore

Positions = npt.NDArray[np.uint64]

MAGIC: Final = 1681511377  # the portable format's
NATIVE_MAGIC: Final = 1681511376
_FORMAT: Final = 1
_NO_RUNS: Final = 12346  # the portable format's cookie without run containers
_RUNS: Final = 12347
_ARRAY_MAX: Final = 4096  # a container of more values is a bitset
_Z85: Final = (
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)
_Z85_VALUE: Final = {c: i for i, c in enumerate(_Z85)}


class DeletionVectorError(ValueError):
    """A deletion vector pgsub cannot read (an unknown format, a wrong checksum)."""


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A deletion vector as an ``add`` or ``remove`` action names it."""

    storage_type: str  # "u": a file named by a UUID; "i": inline; "p": an absolute path
    path_or_inline: str
    offset: int | None
    size: int  # bytes of the bitmap
    cardinality: int  # rows it deletes

    @classmethod
    def of(cls, action: dict[str, object]) -> Descriptor:
        return cls(
            str(action["storageType"]),
            str(action["pathOrInlineDv"]),
            None if action.get("offset") is None else int(str(action["offset"])),
            int(str(action["sizeInBytes"])),
            int(str(action["cardinality"])),
        )

    @property
    def unique_id(self) -> str:
        """The vector's identity in the log (Delta's ``uniqueId``)."""
        base = f"{self.storage_type}{self.path_or_inline}"
        return base if self.offset is None else f"{base}@{self.offset}"

    def action(self) -> dict[str, object]:
        out: dict[str, object] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline,
        }
        if self.offset is not None:
            out["offset"] = self.offset
        out["sizeInBytes"] = self.size
        out["cardinality"] = self.cardinality
        return out

    @property
    def name(self) -> str:
        """The file holding the vector (``u``: relative to the table; ``p``: absolute)."""
        if self.storage_type == "p":
            return canonical(self.path_or_inline, "")
        prefix, encoded = self.path_or_inline[:-20], self.path_or_inline[-20:]
        try:
            name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        except ValueError as exc:  # not 16 bytes
            raise DeletionVectorError(f"a deletion vector named {self.path_or_inline!r}") from exc
        return f"{prefix}/{name}" if prefix else name


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Base85 (Z85) of ``data``, whose length is a multiple of 4."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    out = bytearray()
    for (value,) in struct.iter_unpack(">I", data):
        chunk = bytearray(5)
        word = value
        for i in range(4, -1, -1):
            word, digit = divmod(word, 85)
            chunk[i] = _Z85[digit]
        out += chunk
    return out.decode("ascii")


def z85_decode(text: str) -> bytes:
    """The bytes ``text`` (Z85, a multiple of 5 characters) encodes."""
    try:
        raw = text.encode("ascii")
        if len(raw) % 5:
            raise DeletionVectorError(f"a Z85 text of {len(raw)} characters")
        out = bytearray()
        for at in range(0, len(raw), 5):
            word = 0
            for c in raw[at : at + 5]:
                word = word * 85 + _Z85_VALUE[c]
            out += struct.pack(">I", word)
    except (UnicodeEncodeError, KeyError, struct.error) as exc:  # a character Z85 lacks
        raise DeletionVectorError(f"{text[:40]!r} is not Z85") from exc
    return bytes(out)


def encode(positions: Positions) -> bytes:
    """The ``RoaringBitmapArray`` of ``positions`` (sorted or not, distinct or not)."""
    values = np.asarray(positions, dtype=np.uint64)
    if values.size > 1 and not bool(np.all(values[1:] > values[:-1])):
        values = np.unique(values)  # a sort: skipped for what is sorted already
    highs = (values >> np.uint64(32)).astype(np.uint32)
    parts = [struct.pack("<I", MAGIC)]
    keys, starts = np.unique(highs, return_index=True)
    parts.append(struct.pack("<q", len(keys)))
    bounds = [*starts.tolist(), len(values)]
    for i, key in enumerate(keys.tolist()):
        low = (values[bounds[i] : bounds[i + 1]] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        parts.append(struct.pack("<I", key))
        parts.append(_encode32(low))
    return b"".join(parts)


def _encode32(values: npt.NDArray[np.uint32]) -> bytes:
    """The portable Roaring serialization of sorted distinct ``values`` (no run containers)."""
    keys, starts, counts = np.unique(values >> np.uint32(16), return_index=True, return_counts=True)
    header = [struct.pack("<II", _NO_RUNS, len(keys))]
    header += [
        struct.pack("<HH", k, c - 1) for k, c in zip(keys.tolist(), counts.tolist(), strict=True)
    ]
    bodies = []
    for start, count in zip(starts.tolist(), counts.tolist(), strict=True):
        low = (values[start : start + count] & np.uint32(0xFFFF)).astype("<u2")
        if count <= _ARRAY_MAX:
            bodies.append(low.tobytes())
        else:
            bits = np.zeros(1 << 16, dtype=np.uint8)
            bits[low] = 1
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    offset = sum(len(h) for h in header) + 4 * len(keys)
    offsets = []
    for body in bodies:
        offsets.append(struct.pack("<I", offset))
        offset += len(body)
    return b"".join(header + offsets + bodies)


def decode(data: bytes) -> Positions:
    """The sorted positions of a ``RoaringBitmapArray``, in either format."""
    try:
        return _decode(data)
    except (struct.error, ValueError, IndexError) as exc:  # cut short, or sizes that lie
        if isinstance(exc, DeletionVectorError):
            raise
        raise DeletionVectorError(f"a damaged RoaringBitmapArray ({exc})") from exc


def _decode(data: bytes) -> Positions:
    magic = struct.unpack_from("<I", data)[0] if len(data) >= 4 else None
    parts = []
    if magic == MAGIC:
        (count,) = struct.unpack_from("<q", data, 4)
        at = 12
        for _ in range(count):
            (high,) = struct.unpack_from("<I", data, at)
            low, at = _decode32(data, at + 4)
            parts.append((np.uint64(high) << np.uint64(32)) | low.astype(np.uint64))
    elif magic == NATIVE_MAGIC:
        (count,) = struct.unpack_from("<i", data, 4)
        at = 8
        for high in range(count):  # one bitmap per 32 high bits, empty ones too
            (size,) = struct.unpack_from("<i", data, at)
            low, end = _decode32(data, at + 4)
            if end != at + 4 + size:
                raise DeletionVectorError("a native bitmap whose size does not match")
            at = end
            parts.append((np.uint64(high) << np.uint64(32)) | low.astype(np.uint64))
    else:
        raise DeletionVectorError("not a RoaringBitmapArray (its magic number differs)")
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)


def _decode32(data: bytes, at: int) -> tuple[npt.NDArray[np.uint32], int]:
    """One portable Roaring bitmap at ``at``: its values and the offset after it."""
    (cookie,) = struct.unpack_from("<I", data, at)
    runs: set[int] = set()
    if cookie & 0xFFFF == _RUNS:
        n = (cookie >> 16) + 1
        at += 4
        flags = np.unpackbits(np.frombuffer(data, np.uint8, (n + 7) // 8, at), bitorder="little")
        runs = {int(i) for i in np.flatnonzero(flags[:n])}
        at += (n + 7) // 8
        has_offsets = n >= 4
    elif cookie == _NO_RUNS:
        (n,) = struct.unpack_from("<I", data, at + 4)
        at += 8
        has_offsets = True
    else:
        raise DeletionVectorError(f"a Roaring bitmap with the unknown cookie {cookie}")
    described = struct.unpack_from(f"<{2 * n}H", data, at)
    at += 4 * n + (4 * n if has_offsets else 0)
    parts = []
    for i in range(n):
        key, cardinality = described[2 * i], described[2 * i + 1] + 1
        if i in runs:
            (pairs,) = struct.unpack_from("<H", data, at)
            bounds = np.frombuffer(data, "<u2", 2 * pairs, at + 2).astype(np.uint32)
            at += 2 + 4 * pairs
            low = np.concatenate(
                [np.arange(s, s + n_ + 1, dtype=np.uint32) for s, n_ in bounds.reshape(-1, 2)]
            )
        elif cardinality > _ARRAY_MAX:
            bits = np.unpackbits(np.frombuffer(data, np.uint8, 8192, at), bitorder="little")
            low = np.flatnonzero(bits).astype(np.uint32)
            at += 8192
        else:
            low = np.frombuffer(data, "<u2", cardinality, at).astype(np.uint32)
            at += 2 * cardinality
        parts.append((np.uint32(key) << np.uint32(16)) | low)
    values = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
    return values, at


@dataclass(frozen=True, slots=True)
class VectorFileBody:
    """One new deletion vector file, before it is written: ``name`` in the table's
    folder, ``data`` its bytes, ``encoded`` the descriptor's ``pathOrInlineDv`` and each
    bitmap's ``offsets``."""

    name: str
    data: bytes
    encoded: str
    offsets: list[int]


def file_body(bitmaps: list[bytes]) -> VectorFileBody:
    """``bitmaps`` laid out as one new deletion vector file."""
    name = uuid.uuid4()
    body = bytearray([_FORMAT])
    offsets = []
    for bitmap in bitmaps:
        offsets.append(len(body))
        body += struct.pack(">I", len(bitmap)) + bitmap + struct.pack(">I", zlib.crc32(bitmap))
    return VectorFileBody(
        f"deletion_vector_{name}.bin", bytes(body), z85_encode(name.bytes), offsets
    )


def write_file(store: TableStore, bitmaps: list[bytes]) -> tuple[str, list[int], int]:
    """``bitmaps`` in one new deletion vector file of the table in ``store``: the
    descriptor's ``pathOrInlineDv``, each bitmap's offset and the file's size."""
    body = file_body(bitmaps)
    return body.encoded, body.offsets, store.write(body.name, body.data)


def read(store: TableStore, descriptor: Descriptor) -> Positions:
    """The positions a descriptor of the table in ``store`` deletes."""
    if descriptor.storage_type == "i":
        data = z85_decode(descriptor.path_or_inline)[: descriptor.size]
    elif descriptor.storage_type in ("u", "p"):
        offset = descriptor.offset or 0
        head = store.read_range(descriptor.name, offset, 4 + descriptor.size + 4)
        try:
            (size,) = struct.unpack_from(">I", head)
            data = head[4 : 4 + size]
            (checksum,) = struct.unpack_from(">I", head, 4 + size)
        except struct.error:
            size, data, checksum = -1, b"", 0
        if size != descriptor.size or zlib.crc32(data) != checksum:
            raise DeletionVectorError(
                f"the deletion vector at {descriptor.name}:{offset} is damaged"
            )
    else:
        raise DeletionVectorError(f"a deletion vector of storage type {descriptor.storage_type!r}")
    positions = decode(data)
    if len(positions) != descriptor.cardinality:
        raise DeletionVectorError(
            f"a deletion vector of {len(positions)} rows where its descriptor says "
            f"{descriptor.cardinality}"
        )
    return positions
