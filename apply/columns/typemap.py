"""PostgreSQL column types to Delta (Spark SQL) column types.

The mapping is a contract (docs/architecture.md, "Types"): users query these columns. It is
pure - a type OID and typmod in, a Spark SQL type string out - so the Delta
writer, the table-sync copy and the test oracle all agree on it. Types the
table does not name become ``string`` holding PostgreSQL's text form, which
is lossless for every type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from subscriber.replication.catalog import PgTypeRow

BOOL: Final = 16
BYTEA: Final = 17
CHAR: Final = 18
NAME: Final = 19
INT8: Final = 20
INT2: Final = 21
INT4: Final = 23
TEXT: Final = 25
JSON: Final = 114
FLOAT4: Final = 700
FLOAT8: Final = 701
BPCHAR: Final = 1042
VARCHAR: Final = 1043
DATE: Final = 1082
TIME: Final = 1083
TIMESTAMP: Final = 1114
TIMESTAMPTZ: Final = 1184
INTERVAL: Final = 1186
TIMETZ: Final = 1266
NUMERIC: Final = 1700
UUID: Final = 2950
JSONB: Final = 3802

# OIDs below this are built into PostgreSQL (FirstNormalObjectId).
FIRST_USER_OID: Final = 16384

# Largest precision a Spark decimal holds.
MAX_DECIMAL_PRECISION: Final = 38

_SCALARS: Final[dict[int, str]] = {
    BOOL: "boolean",
    INT2: "short",
    INT4: "int",
    INT8: "long",
    FLOAT4: "float",
    FLOAT8: "double",
    BYTEA: "binary",
    DATE: "date",
    TIMESTAMP: "timestamp_ntz",
    TIMESTAMPTZ: "timestamp",
}

# Array type OID -> element type OID, for the element types the mapping names.
ARRAY_ELEMENTS: Final[dict[int, int]] = {
    1000: BOOL,
    1001: BYTEA,
    1002: CHAR,
    1003: NAME,
    1005: INT2,
    1007: INT4,
    1009: TEXT,
    1014: BPCHAR,
    1015: VARCHAR,
    1016: INT8,
    1021: FLOAT4,
    1022: FLOAT8,
    1115: TIMESTAMP,
    1182: DATE,
    1183: TIME,
    1185: TIMESTAMPTZ,
    1187: INTERVAL,
    1231: NUMERIC,
    1270: TIMETZ,
    2951: UUID,
    199: JSON,
    3807: JSONB,
}


@dataclass(frozen=True, slots=True)
class NumericTypmod:
    """numeric(precision, scale) decoded from an atttypmod."""

    precision: int
    scale: int

    @classmethod
    def decode(cls, typmod: int) -> NumericTypmod | None:
        """None for a numeric declared without precision (typmod -1)."""
        if typmod < 4:
            return None
        packed = typmod - 4
        scale = packed & 0x7FF
        # PostgreSQL 15+ stores the scale as a signed 11-bit field.
        if scale & 0x400:
            scale -= 0x800
        return cls(precision=(packed >> 16) & 0xFFFF, scale=scale)

    def fits_spark_decimal(self) -> bool:
        return 0 < self.precision <= MAX_DECIMAL_PRECISION and 0 <= self.scale <= self.precision


def spark_type(type_oid: int, typmod: int = -1) -> str:
    """The Delta column type for a PostgreSQL column of ``type_oid``.

    ``type_oid`` is the base type: callers resolve domains to their base type
    first (an enum has no base type and maps to ``string``).
    """
    if type_oid in ARRAY_ELEMENTS:
        # An array column's typmod is its element's typmod.
        return f"array<{spark_type(ARRAY_ELEMENTS[type_oid], typmod)}>"
    if type_oid == NUMERIC:
        numeric = NumericTypmod.decode(typmod)
        if numeric is not None and numeric.fits_spark_decimal():
            return f"decimal({numeric.precision},{numeric.scale})"
        return "string"
    return _SCALARS.get(type_oid, "string")


def is_text_form(type_oid: int, typmod: int = -1) -> bool:
    """Whether the Delta column holds PostgreSQL's text form of the value."""
    return spark_type(type_oid, typmod).replace("array<", "").rstrip(">") == "string"


# Element type OID -> its builtin array type OID (the inverse of ARRAY_ELEMENTS).
ARRAY_OF: Final[dict[int, int]] = {element: array for array, element in ARRAY_ELEMENTS.items()}


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A publisher column's type as the target sees it.

    ``oid`` is a builtin scalar type (domains resolved to their base type);
    anything held as PostgreSQL's text form (enums, composites, ranges,
    extension types) is ``TEXT``. ``is_array`` marks an array of ``oid``.
    """

    oid: int
    typmod: int = -1
    is_array: bool = False
    # The type whose binary form (``binary: true``) values of this column arrive in, when not
    # ``oid``: a composite, range or extension type held as text (0: ``oid`` itself; an
    # enum's binary form is its label, text).
    binary_oid: int = field(default=0, compare=False)

    @property
    def wire_oid(self) -> int:
        """The (element) type whose binary form the values have."""
        return self.binary_oid or self.oid

    @property
    def spark_type(self) -> str:
        element = spark_type(self.oid, self.typmod)
        return f"array<{element}>" if self.is_array else element

    @property
    def text_form(self) -> bool:
        """Whether the Delta column holds PostgreSQL's text form of each value (or element)."""
        return spark_type(self.oid, self.typmod) == "string"


TypeLookup = Callable[[int], PgTypeRow | None]


def resolve(type_oid: int, typmod: int, lookup: TypeLookup) -> ColumnType:
    """Resolve a column type: domains to their base, arrays to their element.

    ``lookup`` returns the pg_type row of a user-defined type (None when
    unknown). A type the mapping does not name is held as text.
    """
    if type_oid in ARRAY_ELEMENTS:
        return ColumnType(ARRAY_ELEMENTS[type_oid], typmod, is_array=True)
    if type_oid < FIRST_USER_OID:
        return ColumnType(type_oid, typmod)
    row = lookup(type_oid)
    if row is None:
        return ColumnType(TEXT, binary_oid=type_oid)
    if row.typtype == "d":
        # A domain's own typmod (numeric(10,2) under the domain) is the one that counts.
        return resolve(row.basetype, row.typtypmod, lookup)
    if row.category == "A" and row.elem:
        element = resolve(row.elem, typmod, lookup)
        if element.is_array:
            return ColumnType(TEXT, binary_oid=type_oid)
        return ColumnType(element.oid, element.typmod, True, element.binary_oid)
    if row.typtype == "e":
        return ColumnType(TEXT)  # an enum's binary form is its label
    return ColumnType(TEXT, binary_oid=type_oid)
