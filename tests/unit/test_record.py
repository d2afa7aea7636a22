"""slurmfabric._common.record: the dataclass stand-in of the per-rank path."""

from __future__ import annotations

import pytest

from slurmfabric._common.record import Record, as_plain, replace


class Point(Record):
    __slots__ = ("x", "y", "tags", "meta")
    _defaults = {"y": 0}
    _factories = {"tags": list, "meta": dict}
    _unhashed = ("meta",)


class Bag(Record):
    __slots__ = ("items",)
    _factories = {"items": list}
    _frozen = False


def test_construction_defaults_and_fresh_factories():
    a, b = Point(1), Point(x=1)
    assert (a.x, a.y, a.tags, a.meta) == (1, 0, [], {})
    assert a == b and a.tags is not b.tags  # a fresh list each time, as default_factory
    assert Point(1, 2).y == 2 and Point(1, y=3).y == 3
    with pytest.raises(TypeError, match="needs 'x'"):
        Point()
    with pytest.raises(TypeError, match="no field"):
        Point(1, z=2)
    with pytest.raises(TypeError, match="twice"):
        Point(1, x=2)
    with pytest.raises(TypeError, match="at most"):
        Point(1, 2, [], {}, 5)


def test_frozen_eq_hash_repr():
    p = Point(1, 2, ("a",), {"k": 1})
    with pytest.raises(AttributeError):
        p.x = 5
    assert p != Point(1, 3, ("a",), {"k": 1})
    assert hash(p) == hash(Point(1, 2, ("a",), {"other": 2}))  # meta left out, like hash=False
    assert repr(p) == "Point(x=1, y=2, tags=('a',), meta={'k': 1})"
    assert p.__eq__(object()) is NotImplemented


def test_mutable_records_are_unhashable():
    bag = Bag()
    bag.items.append(1)
    bag.items = [2]
    assert bag.items == [2]
    with pytest.raises(TypeError):
        hash(bag)


def test_as_plain_and_replace():
    p = Point(1, 2, (Point(3),), {"k": [Point(4)]})
    plain = as_plain(p)
    assert plain == {
        "x": 1, "y": 2,
        "tags": ({"x": 3, "y": 0, "tags": [], "meta": {}},),
        "meta": {"k": [{"x": 4, "y": 0, "tags": [], "meta": {}}]},
    }  # fmt: skip
    q = replace(p, y=9)
    assert q.y == 9 and q.x == 1 and p.y == 2 and type(q) is Point
