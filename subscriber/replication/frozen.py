"""Frozen messages made quickly: the ``__init__`` of the messages every transaction is
made of on its way, without ``object.__setattr__`` for each field.

A frozen dataclass's own ``__init__`` sets each field through ``object.__setattr__`` (its
``__setattr__`` refuses): the attribute looked up on ``object``, then the slot looked up
on the class, for every field of every message. A backlog of single-row transactions makes
about ten such messages a transaction (the Begin, the change, the Commit, the row change,
the transaction, the queue's entry...): 0.52 us for one of four fields against 0.32 through
the slots' own setters, 1.7 us of the receiver's 10.7 a transaction
(docs/performance.md, "Messages made without object.__setattr__"). ``quick`` gives such a
class an ``__init__`` that calls each slot's setter directly: the same signature, the
same values, still frozen.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

T = TypeVar("T")


def quick(cls: type[T]) -> type[T]:
    """``cls`` (a ``@dataclass(frozen=True, slots=True)`` whose fields are all positional
    ``__init__`` parameters, with plain defaults and no ``__post_init__``) with an
    ``__init__`` that sets each slot through its own setter."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: quick takes a frozen dataclass with slots")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: quick does not call __post_init__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # a dataclass, checked
    # Each field a parameter, in order, by position or name; nothing else (an InitVar, a
    # field left out of ``__init__`` or keyword-only would be made differently here).
    taken = list(inspect.signature(cls.__init__).parameters.values())[1:]
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    if [(p.name, p.kind) for p in taken] != [(f.name, positional) for f in fields]:
        raise TypeError(f"{cls.__name__}: quick takes fields that are positional parameters")
    namespace: dict[str, Any] = {}
    parameters, body = [], []
    for field in fields:
        name = field.name
        if field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{name}: quick takes plain defaults only")
        namespace[f"_set_{name}"] = cls.__dict__[name].__set__
        if field.default is dataclasses.MISSING:
            parameters.append(name)
        else:
            namespace[f"_default_{name}"] = field.default
            parameters.append(f"{name}=_default_{name}")
        body.append(f"    _set_{name}(self, {name})\n")
    source = f"def __init__(self, {', '.join(parameters)}):\n" + "".join(body)
    exec(source, namespace)  # noqa: S102 - made from the field names, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
