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
