"""Read-only views of a run's completed outputs, built per step in O(1) instead of copied.

A step's templates and plan see the outputs of every completed step; copying them into a new dict
on every step made a run of n steps cost O(n²) (a 10,000-step run copied 10,000 outputs per step).
"""

from __future__ import annotations

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
