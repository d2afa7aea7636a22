"""Plain record classes for the per-rank path, without ``dataclasses``.

``import dataclasses`` pulls in ``inspect`` (and with it ``ast``, ``dis``, ``tokenize``):
about 8 ms, more than half of the start-up budget of ``slurmfabric env``/``launch`` on every
rank. A record here declares ``__slots__`` (the fields, in order) and optional
``_defaults``/``_factories``; it gets keyword or positional construction, ``__eq__``,
``__repr__`` and, when frozen, ``__hash__`` and immutability, like a dataclass would.
"""

from __future__ import annotations


class Record:
    """Base for records: fields are ``__slots__``; subclasses set ``_frozen`` and defaults."""

    __slots__ = ()
    _defaults: dict[str, object] = {}
    _factories: dict[str, object] = {}  # field -> callable making a fresh default (list, dict)
    _unhashed: tuple[str, ...] = ()  # mapping fields left out of __hash__, as hash=False
    _frozen = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        fields = self.__slots__
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes at most {len(fields)} arguments")
        setter = object.__setattr__
        for name, value in zip(fields, args):
            if name in kwargs:
                raise TypeError(f"{type(self).__name__} got {name!r} twice")
            setter(self, name, value)
        for name in fields[len(args) :]:
            if name in kwargs:
                value = kwargs.pop(name)
            elif name in self._defaults:
                value = self._defaults[name]
            elif name in self._factories:
                value = self._factories[name]()  # type: ignore[operator]
            else:
                raise TypeError(f"{type(self).__name__} needs {name!r}")
            setter(self, name, value)
        if kwargs:  # names given twice raised above: what is left is unknown
            raise TypeError(f"{type(self).__name__} has no field(s) {sorted(kwargs)}")

    def __setattr__(self, name: str, value: object) -> None:
        if self._frozen:
            raise AttributeError(f"{type(self).__name__} is frozen; cannot set {name}")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self._frozen:
            raise AttributeError(f"{type(self).__name__} is frozen; cannot delete {name}")
        object.__delattr__(self, name)

    def _astuple(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._astuple() == other._astuple()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        if not self._frozen:
            raise TypeError(f"unhashable type: {type(self).__name__!r}")
        return hash(
            tuple(getattr(self, n) for n in self.__slots__ if n not in self._unhashed)
        )

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({body})"


def as_plain(obj: object) -> object:
    """``dataclasses.asdict`` for records: nested records become dicts, containers copied."""
    if isinstance(obj, Record):
        return {name: as_plain(getattr(obj, name)) for name in obj.__slots__}
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_plain(item) for item in obj)
    if isinstance(obj, dict):
        return type(obj)((as_plain(k), as_plain(v)) for k, v in obj.items())
    return obj


def replace(obj: Record, **changes: object) -> Record:
    """``dataclasses.replace`` for records: a copy with some fields changed."""
    values = {name: getattr(obj, name) for name in obj.__slots__}
    values.update(changes)
    return type(obj)(**values)
