"""Table names: one unambiguous text per (schema, table), and one warehouse folder per table.

Pure. PostgreSQL allows any character in a quoted identifier, dots and
slashes included, so ``schema.table`` joined naively is ambiguous (schema
``a.b`` table ``c`` against schema ``a`` table ``b.c``) and a name used
as a path can leave the warehouse (``..``). Here:

- ``qualified_name`` quotes each part the way PostgreSQL's ``quote_ident``
  does - only when it must - so ``public.t`` reads as before and every
  pair has its own text; ``split_qualified`` reads it back.
- ``path_part`` keeps ASCII letters, digits, ``_``, ``-`` and ``$`` as they
  are (plain names keep the folders they always had) and writes every
  other byte of the UTF-8 name as ``~XX``, so ``.``, ``/`` and ``~`` can
  never form another name's folder or leave the warehouse. The schema
  ``_pgsub`` would collide with pgsub's own state folder and becomes
  ``~5Fpgsub``. Not ``%XX``: delta-rs reads a local path as a URL and
  decodes it, so it could not open a folder with ``%`` in its name.
"""

from __future__ import annotations

import functools
import re
from typing import Final

STATE_FOLDER: Final = "_pgsub"
_PLAIN_IDENT = re.compile(r"[a-z_][a-z0-9_$]*")
_SAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-$")


def quote_ident(part: str) -> str:
    """PostgreSQL's ``quote_ident``: quoted only when the bare form would read differently."""
    if _PLAIN_IDENT.fullmatch(part):
        return part
    return '"' + part.replace('"', '""') + '"'


@functools.lru_cache(maxsize=65536)
def qualified_name(schema: str, name: str) -> str:
    """``schema.name``, each part quoted as ``quote_ident`` does; kept, as it is asked for
    each change (the leader's table filter, a batch's forming)."""
    return f"{quote_ident(schema)}.{quote_ident(name)}"


def split_qualified(text: str) -> tuple[str, str]:
    """The (schema, table) of a ``qualified_name``; a bare ``t`` is ``public.t``."""
    parts: list[str] = []
    position = 0
    while position <= len(text):
        if text.startswith('"', position):
            end = position + 1
            value = []
            while True:
                close = text.find('"', end)
                if close < 0:
                    raise ValueError(f"unterminated quoted name in {text!r}")
                value.append(text[end:close])
                if text.startswith('"', close + 1):
                    value.append('"')
                    end = close + 2
                    continue
                position = close + 1
                break
            parts.append("".join(value))
        else:
            dot = text.find(".", position)
            end = len(text) if dot < 0 else dot
            parts.append(text[position:end])
            position = end
        if position == len(text):
            break
        if text[position] != ".":
            raise ValueError(f"not a table name: {text!r}")
        position += 1
    if len(parts) == 1:
        parts.insert(0, "public")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"not a schema-qualified table name: {text!r}")
    return parts[0], parts[1]


def path_part(part: str) -> str:
    """One name as one folder name (see the module's docstring)."""
    encoded = "".join(
        chr(byte) if byte in _SAFE_BYTES else f"~{byte:02X}" for byte in part.encode("utf-8")
    )
    return "~5F" + encoded[1:] if encoded == STATE_FOLDER else encoded


def table_folder(qualified: str) -> str:
    """``<schema>/<table>`` under the warehouse for a ``qualified_name``."""
    schema, name = split_qualified(qualified)
    return f"{path_part(schema)}/{path_part(name)}"
