"""Read-only views of a run's completed outputs, built per step in O(1) instead of copied.

A step's templates and plan see the outputs of every completed step; copying them into a new dict
on every step made a run of n steps cost O(n²) (a 10,000-step run copied 10,000 outputs per step).
"""

from __future__ import annotations

import threading
from collections.abc import Container, Iterator, Mapping
from typing import Any


class OnlyKeys(Mapping[str, Any]):
    """`source` restricted to the keys `allowed` contains."""

    def __init__(self, source: Mapping[str, Any], allowed: Container[str]) -> None:
        self._source, self._allowed = source, allowed

    def __getitem__(self, key: str) -> Any:
        if key not in self._allowed:
            raise KeyError(key)
        return self._source[key]

    def __iter__(self) -> Iterator[str]:
        return (key for key in self._source if key in self._allowed)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class AsNodeOutputs(Mapping[str, Any]):
    """`outputs` as templates see them: `nodes.<step>.output`."""

    def __init__(self, outputs: Mapping[str, Any]) -> None:
        self._outputs = outputs

    def __getitem__(self, key: str) -> dict[str, Any]:
        return {"output": self._outputs[key]}

    def __iter__(self) -> Iterator[str]:
        return iter(self._outputs)

    def __len__(self) -> int:
        return len(self._outputs)


class WithOne(Mapping[str, Any]):
    """`source` plus one more key (or that key's new value): a completion's outputs before the
    journal has it."""

    def __init__(self, source: Mapping[str, Any], key: str, value: Any) -> None:
        self._source, self._key, self._value = source, key, value

    def __getitem__(self, key: str) -> Any:
        return self._value if key == self._key else self._source[key]

    def __iter__(self) -> Iterator[str]:
        yield from (key for key in self._source if key != self._key)
        yield self._key

    def __len__(self) -> int:
        return len(self._source) + (self._key not in self._source)


class GrowingOutputs(Mapping[str, Any]):
    """The first `size` entries of a record that a run's successive step logs share and only ever
    add to, so that extending a log by one step costs O(1), not a copy of every output so far.

    `added` is this view plus new entries. It appends to the shared record only when this view
    is its latest one and every key is new; otherwise (an older log extended again, a key that
    reappears) it copies, so no view ever sees its entries change. A view is read while other
    threads may append to its record: it walks the record's list of keys by position (appending
    to a list never disturbs that), never the dict, which may not change size during a walk."""

    __slots__ = ("_record", "_size")

    def __init__(self, record: _Record | None = None, size: int = 0) -> None:
        self._record = record if record is not None else _Record()
        self._size = size

    def __getitem__(self, key: str) -> Any:
        index, value = self._record.entries[key]
        if index >= self._size:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        entry = self._record.entries.get(key)  # type: ignore[call-overload]
        return entry is not None and entry[0] < self._size

    def __iter__(self) -> Iterator[str]:
        keys = self._record.keys
        return (keys[i] for i in range(self._size))

    def __len__(self) -> int:
        return self._size

    def added(self, new: Mapping[str, Any]) -> GrowingOutputs:
        record = self._record
        if not new:
            return self
        with record.lock:
            entries = record.entries
            if len(record.keys) == self._size and not any(key in entries for key in new):
                for key, value in new.items():
                    entries[key] = (len(record.keys), value)
                    record.keys.append(key)
                return GrowingOutputs(record, len(record.keys))
        merged = {key: self[key] for key in self}  # a dict of this thread's own: safe to walk
        merged.update(new)
        fresh = _Record()
        for key, value in merged.items():
            fresh.entries[key] = (len(fresh.keys), value)
            fresh.keys.append(key)
        return GrowingOutputs(fresh, len(fresh.keys))


class _Record:
    __slots__ = ("entries", "keys", "lock")

    def __init__(self) -> None:
        self.entries: dict[str, tuple[int, Any]] = {}  # key -> (its position in keys, its value)
        self.keys: list[str] = []  # in the order they were added
        self.lock = threading.Lock()  # logs of one run may be extended from several threads
