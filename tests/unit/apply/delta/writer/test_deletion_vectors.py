"""Delta's deletion vector formats (apply/delta/writer/deletion_vectors.py): Z85, the
RoaringBitmapArray (with the run containers Spark writes) and the vector file."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apply.delta.files.local_store import LocalStore
from apply.delta.writer import deletion_vectors as dv


def test_z85_encodes_as_zeromq_specifies() -> None:
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert dv.z85_encode(data) == "HelloWorld"  # the example of ZeroMQ's RFC 32
    assert dv.z85_decode("HelloWorld") == data


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 70_000),  # array containers
            st.integers(2**32 - 5, 2**32 + 5),  # two 32-bit bitmaps
        ),
        max_size=300,
    ),
    st.lists(st.integers(0, 5), max_size=3),
)
def test_positions_survive_their_encoding(scattered: list[int], dense: list[int]) -> None:
    """Any positions, some containers dense enough to be bitsets (> 4,096 values)."""
    positions = set(scattered)
    for block in dense:
        positions |= set(range(block * 65_536, block * 65_536 + 5_000, 1))
    want = np.array(sorted(positions), dtype=np.uint64)
    assert np.array_equal(dv.decode(dv.encode(want)), want)


def _portable_with_runs() -> bytes:
    """A bitmap as Java's RoaringBitmap writes it after ``runOptimize``: container 0 holds
    the runs 10-19 and 100; container 1 the array 65,537 and 65,540 (four containers or
    fewer: no offset header)."""
    cookie = 12347 | (1 << 16)  # runs, two containers
    body = struct.pack("<I", cookie) + bytes([0b01])  # container 0 is a run container
    body += struct.pack("<HHHH", 0, 10, 1, 1)  # keys and cardinalities - 1
    body += struct.pack("<HHHHH", 2, 10, 9, 100, 0)  # two runs: (start, length - 1)
    body += struct.pack("<HH", 1, 4)  # the array container's low 16 bits
    return struct.pack("<Iq", dv.MAGIC, 1) + struct.pack("<I", 0) + body


def test_run_containers_are_read() -> None:
    want = [*range(10, 20), 100, 65_537, 65_540]
    assert dv.decode(_portable_with_runs()).tolist() == want


def test_a_vector_file_is_written_and_read_back(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    first, second = np.array([3, 1, 2], np.uint64), np.arange(0, 10_000, 2, dtype=np.uint64)
    bitmaps = [dv.encode(first), dv.encode(second)]
    encoded, offsets, size = dv.write_file(store, bitmaps)
    assert offsets[0] == 1  # after the format byte, as Spark's readers expect
    for bitmap, offset, want in zip(bitmaps, offsets, [first, second], strict=True):
        descriptor = dv.Descriptor("u", encoded, offset, len(bitmap), len(want))
        assert (tmp_path / descriptor.name).stat().st_size == size
        assert dv.read(store, descriptor).tolist() == sorted(want.tolist())
    padded = bitmaps[0] + b"\0" * (-len(bitmaps[0]) % 4)  # Delta pads an inline bitmap
    inline = dv.Descriptor("i", dv.z85_encode(padded), None, len(bitmaps[0]), 3)
    assert dv.read(store, inline).tolist() == [1, 2, 3]


def test_a_damaged_vector_is_an_error(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    bitmap = dv.encode(np.array([5], np.uint64))
    encoded, (offset,), _ = dv.write_file(store, [bitmap])
    descriptor = dv.Descriptor("u", encoded, offset, len(bitmap), 1)
    file = tmp_path / descriptor.name
    data = bytearray(file.read_bytes())
    data[-5] ^= 0xFF  # a byte of the bitmap: its CRC no longer matches
    file.write_bytes(bytes(data))
    assert zlib.crc32(bytes(data[5:-4])) != struct.unpack(">I", data[-4:])[0]
    with pytest.raises(dv.DeletionVectorError, match="damaged"):
        dv.read(store, descriptor)
    with pytest.raises(dv.DeletionVectorError, match="magic"):
        dv.decode(b"\0" * 16)
    file.write_bytes(bytes(data[:3]))  # cut short
    with pytest.raises(dv.DeletionVectorError, match="damaged"):
        dv.read(store, descriptor)


def _native(positions: list[int]) -> bytes:
    """The native ``RoaringBitmapArray`` format, as Delta's Scala writes it: its magic
    number, a 32-bit count of bitmaps (one per 32 high bits, empty ones too), then each
    bitmap's size and its standard Roaring serialization, with no key."""
    highs = max(p >> 32 for p in positions) + 1 if positions else 0
    body = struct.pack("<Ii", dv.NATIVE_MAGIC, highs)
    for high in range(highs):
        low = np.array(sorted(p & 0xFFFFFFFF for p in positions if p >> 32 == high), np.uint32)
        bitmap = dv._encode32(low)
        body += struct.pack("<i", len(bitmap)) + bitmap
    return body


@settings(max_examples=100, deadline=None)
@given(st.sets(st.one_of(st.integers(0, 70_000), st.integers(2**33, 2**33 + 9)), max_size=200))
def test_the_native_format_spark_also_reads_is_read(positions: set[int]) -> None:
    assert dv.decode(_native(sorted(positions))).tolist() == sorted(positions)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack("<Iq", dv.MAGIC, 3), "cut short after its count"),
        (struct.pack("<Ii", dv.NATIVE_MAGIC, 1) + struct.pack("<i", 999), "a size that lies"),
        (struct.pack("<IqI", dv.MAGIC, 1, 0) + struct.pack("<II", 7, 1), "an unknown cookie"),
    ],
)
def test_a_bitmap_that_is_not_whole_is_a_deletion_vector_error(data: bytes, reason: str) -> None:
    """Never a bare struct.error or IndexError, which no caller would take for a vector
    pgsub cannot read (the batch then goes to Spark): ``reason``."""
    with pytest.raises(dv.DeletionVectorError):
        dv.decode(data)


@pytest.mark.parametrize("text", ["abcd~", "héllo", "abc"])
def test_a_name_that_is_not_z85_is_a_deletion_vector_error(text: str) -> None:
    with pytest.raises(dv.DeletionVectorError):
        dv.z85_decode(text)


def test_a_vector_file_name_that_is_not_z85_is_a_deletion_vector_error() -> None:
    assert dv.Descriptor("u", "ab" + "0" * 20, 1, 4, 1).name.startswith("ab/deletion_vector_")
    with pytest.raises(dv.DeletionVectorError):
        _ = dv.Descriptor("u", "0" * 19 + "~", 1, 4, 1).name
