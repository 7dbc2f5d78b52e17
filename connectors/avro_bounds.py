"""Bounds on decoding untrusted Avro, checked on the bytes before fastavro builds anything.

fastavro trusts what a value says about itself, and two schema shapes turn that into a denial of service:

- **items that take no bytes** (`null`, `fixed` of size 0, records made only of those): a 10-byte
  `array<null>` value announcing 2⁶³ items never finishes decoding and grows about 200 MB/s;
- **recursive types** (a linked list, a tree): each level of nesting is one more C call, and a 10 kB value
  nested 10,000 deep overflows the C stack (a segmentation fault).

Every other block of items is bounded by the bytes left (each item takes at least one byte, so fastavro stops
at the end of the value), so :func:`bounds_check` returns None for such schemas and they cost nothing per
record. For the two shapes above, the check walks the value without building it (no recursion; items
that take no bytes are counted, not walked) and raises :class:`AvroBoundsError` on a block count larger
than the bytes left allow, more than `max_items` zero-byte items, or records nested deeper than
`max_depth`. It costs about as much as fastavro's own decoding (a 90 kB tree of 10,000 records: 30 ms).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["DEFAULT_MAX_DEPTH", "DEFAULT_MAX_ITEMS", "AvroBoundsError", "bounds_check"]

#: Zero-byte items (e.g. the nulls of an `array<null>`) one value may hold.
DEFAULT_MAX_ITEMS: Final = 1_000_000
#: Records nested in one value (fastavro 1.13 read 1,000 levels of a linked list and crashed at 10,000).
DEFAULT_MAX_DEPTH: Final = 200

_FIXED_SIZE: Final = {"null": 0, "boolean": 1, "float": 4, "double": 8}
_SKIP, _VARINT, _UNION, _SIZED, _RECORD, _BLOCKS = range(6)
_CODES: Final = {
    "skip": _SKIP,
    "varint": _VARINT,
    "enum": _VARINT,
    "union": _UNION,
    "sized": _SIZED,
    "record": _RECORD,
    "array": _BLOCKS,
    "map": _BLOCKS,
}
_NAMED: Final = ("record", "error", "enum", "fixed")


class AvroBoundsError(ValueError):
    """A value that would take unbounded time, memory or stack to decode."""


@dataclass(eq=False, slots=True)
class _Node:
    """One schema node, names resolved (recursive schemas are cyclic graphs of nodes)."""

    kind: str  # "skip" (fixed size), "varint", "sized" (bytes, string), "enum", "record", "union", "array", "map"
    size: int = 0  # skip: the byte count; enum: the number of symbols
    children: list[_Node] = field(default_factory=list)  # record: fields; union: branches; array/map: the item
    min_size: int = -1  # fewest bytes a value takes; -1 until computed
    code: int = 0  # `kind` as one of the _SKIP... codes, for the walk
    reversed_children: tuple[_Node, ...] = ()  # record: its fields last to first, for the walk


def bounds_check(
    schema: Any, *, max_items: int = DEFAULT_MAX_ITEMS, max_depth: int = DEFAULT_MAX_DEPTH
) -> Callable[[bytes | memoryview], None] | None:
    """A check for values of the parsed writer `schema`, or None when fastavro is bounded on its own."""
    root = _compile(schema, {}, _named_types(schema))
    nodes = _all_nodes(root)
    for node in nodes:
        _min_size(node, set())
        node.code = _CODES[node.kind]
        node.reversed_children = tuple(reversed(node.children))
    zero_items = any(n.kind == "array" and n.children[0].min_size == 0 for n in nodes)
    if not zero_items and not _is_recursive(root):
        return None
    return lambda data: _walk(root, memoryview(data), max_items=max_items, max_depth=max_depth)


def _named_types(schema: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    pending = [schema]
    while pending:
        s = pending.pop()
        if isinstance(s, list):
            pending.extend(s)
        elif isinstance(s, dict):
            if s.get("type") in _NAMED and isinstance(s.get("name"), str):
                found.setdefault(s["name"], s)
            pending.extend(f.get("type") for f in s.get("fields", ()) if isinstance(f, dict))
            pending.extend(s[k] for k in ("items", "values") if k in s)
            if isinstance(s.get("type"), dict | list):
                pending.append(s["type"])
    return found


def _compile(schema: Any, done: dict[str, _Node], named: Mapping[str, Any]) -> _Node:
    if isinstance(schema, list):
        return _Node("union", children=[_compile(s, done, named) for s in schema])
    if isinstance(schema, str):
        if schema in done:
            return done[schema]
        if schema in named:
            return _compile(named[schema], done, named)
        return _primitive(schema)
    kind = schema["type"]
    if not isinstance(kind, str) or kind not in ("record", "error", "enum", "fixed", "array", "map"):
        return _compile(kind, done, named)  # a logical type, or {"type": {...}}
    if kind in ("enum", "fixed"):
        node = _Node("enum", size=len(schema["symbols"])) if kind == "enum" else _Node("skip", size=schema["size"])
        done[schema["name"]] = node
        return node
    if kind in ("array", "map"):
        item = _compile(schema["items" if kind == "array" else "values"], done, named)
        return _Node(kind, children=[item if kind == "array" else _Node("record", children=[_Node("sized"), item])])
    node = done[schema["name"]] = _Node("record")  # registered first: its fields may refer back to it
    node.children = [_compile(f["type"], done, named) for f in schema["fields"]]
    return node


def _primitive(name: str) -> _Node:
    if name in _FIXED_SIZE:
        return _Node("skip", size=_FIXED_SIZE[name])
    if name in ("int", "long"):
        return _Node("varint")
    if name in ("bytes", "string"):
        return _Node("sized")
    raise AvroBoundsError(f"unknown Avro type {name!r}")


def _all_nodes(root: _Node) -> list[_Node]:
    seen: dict[int, _Node] = {}
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            pending.extend(node.children)
    return list(seen.values())


def _min_size(node: _Node, visiting: set[int]) -> int:
    if node.min_size >= 0:
        return node.min_size
    if id(node) in visiting:  # a cycle: reached again through itself, it adds nothing to the minimum
        return 0
    visiting.add(id(node))
    if node.kind == "skip":
        size = node.size
    elif node.kind == "record":
        size = sum(_min_size(c, visiting) for c in node.children)
    else:  # a varint, a length, a union index, an enum index or a block count: at least one byte
        size = 1
        for child in node.children:
            _min_size(child, visiting)
    visiting.discard(id(node))
    node.min_size = size
    return size


def _is_recursive(root: _Node) -> bool:
    """Whether a node can contain itself (depth first, iterative, with the nodes on the current path)."""
    on_path: set[int] = set()
    finished: set[int] = set()
    stack: list[tuple[_Node, int]] = [(root, 0)]
    while stack:
        node, index = stack.pop()
        if index == 0:
            if id(node) in on_path:
                return True
            if id(node) in finished:
                continue
            on_path.add(id(node))
        if index < len(node.children):
            stack.append((node, index + 1))
            stack.append((node.children[index], 0))
        else:
            on_path.discard(id(node))
            finished.add(id(node))
    return False


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (Avro int/long, at most 10 bytes) at `pos`, and the position after it."""
    result = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        byte = data[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), i + 1
        shift += 7
    raise AvroBoundsError(f"a truncated or over-long varint at byte {pos}")


def _walk(root: _Node, data: memoryview, *, max_items: int, max_depth: int) -> None:
    """Walk one value as fastavro would read it, without building it (see the module docstring).

    Depth counts nested records: every cycle of a schema goes through a record, so that bounds recursion."""
    raw = data.tobytes()  # indexing bytes is faster than a memoryview, and values are small
    pos, end, zero_items = 0, len(raw), 0
    stack: list[tuple[_Node, int, int]] = [(root, 0, 1)]  # node, depth, how many values of it follow
    while stack:
        node, depth, repeat = stack.pop()
        if repeat > 1:
            stack.append((node, depth, repeat - 1))
        kind = node.code
        if kind == _SKIP:
            pos += node.size
            continue
        if kind == _RECORD:
            if depth >= max_depth:
                raise AvroBoundsError(f"records nested deeper than {max_depth} levels")
            stack.extend([(child, depth + 1, 1) for child in node.reversed_children])
            continue
        if pos < end and raw[pos] < 0x80:  # a one-byte varint: the common case
            value = (raw[pos] >> 1) ^ -(raw[pos] & 1)
            pos += 1
        else:
            value, pos = _varint(raw, pos)
        if kind == _UNION:
            if not 0 <= value < len(node.children):
                raise AvroBoundsError(f"union branch {value} of {len(node.children)} at byte {pos}")
            stack.append((node.children[value], depth, 1))
        elif kind == _SIZED:
            if not 0 <= value <= end - pos:
                raise AvroBoundsError(f"a length of {value} bytes at byte {pos}, {end - pos} left")
            pos += value
        elif kind == _BLOCKS and value != 0:  # one block of items, then this node again for the next block
            pos = _block(node, value, raw, pos, stack, depth)
            item = node.children[0]
            if item.min_size == 0:
                zero_items += abs(value)
                if zero_items > max_items:
                    raise AvroBoundsError(f"more than {max_items} items that take no bytes (a block of {abs(value)})")
        if pos > end:
            raise AvroBoundsError(f"the value ends after {end} bytes, in the middle of an item")
    if pos > end:
        raise AvroBoundsError(f"the value ends after {end} bytes, in the middle of an item")


def _block(node: _Node, count: int, raw: bytes, pos: int, stack: list[tuple[_Node, int, int]], depth: int) -> int:
    """Check one block of `count` items and queue them (items that take no bytes need no walking)."""
    if count < 0:  # a negative count is followed by the block's size in bytes
        count = -count
        _, pos = _varint(raw, pos)
    item = node.children[0]
    if item.min_size > 0 and count * item.min_size > len(raw) - pos:
        raise AvroBoundsError(f"a block of {count} items at byte {pos}, more than {len(raw) - pos} bytes left can hold")
    stack.append((node, depth, 1))
    if item.min_size > 0:
        stack.append((item, depth, count))
    return pos
