"""Prices per model, in US dollars per million tokens (input, output), overridable.

PAL_PRICES names a JSON file (or holds JSON) mapping model names to {"input": $, "output": $} per
million tokens; it adds to and overrides the table below. An unknown model costs 0 and says so in
the step's output (`priced: false`), so a missing price is visible rather than silently wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

from pal.errors import ConfigError

PER_MILLION = Decimal(1_000_000)

DEFAULT_PRICES: dict[str, tuple[Decimal, Decimal]] = {
    "gpt-4o": (Decimal("2.50"), Decimal("10.00")),
    "gpt-4o-mini": (Decimal("0.15"), Decimal("0.60")),
    "gpt-4.1": (Decimal("2.00"), Decimal("8.00")),
    "gpt-4.1-mini": (Decimal("0.40"), Decimal("1.60")),
    "claude-sonnet-4-5": (Decimal("3.00"), Decimal("15.00")),
    "claude-haiku-4-5": (Decimal("1.00"), Decimal("5.00")),
    "claude-opus-4-1": (Decimal("15.00"), Decimal("75.00")),
    # The offline provider has a price so that cost accounting is exercised end to end.
    "scripted-1": (Decimal("1.00"), Decimal("2.00")),
}


def load_prices(raw: str) -> dict[str, tuple[Decimal, Decimal]]:
    """The price table with PAL_PRICES (a path or inline JSON) applied on top."""
    prices = dict(DEFAULT_PRICES)
    raw = raw.strip()
    if not raw:
        return prices
    text = raw if raw.startswith("{") else _read(raw)
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"PAL_PRICES is not JSON: {exc}") from exc
    if not isinstance(table, Mapping):
        raise ConfigError("PAL_PRICES must map model names to {\"input\": ..., \"output\": ...}")
    for model, entry in table.items():
        try:
            prices[str(model)] = (Decimal(str(entry["input"])), Decimal(str(entry["output"])))
        except (KeyError, TypeError, ArithmeticError) as exc:
            raise ConfigError(f"PAL_PRICES entry {model!r} needs numeric 'input' and 'output' "
                              "(dollars per million tokens)") from exc
    return prices


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"PAL_PRICES={path!r}: cannot read it: {exc}") from exc


_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


def price_of(prices: Mapping[str, tuple[Decimal, Decimal]], *models: str) -> tuple[Decimal, Decimal] | None:
    """The first price found for `models` (the name asked for, then the one answered): exact, then
    without a dated snapshot suffix (gpt-4o-mini-2024-07-18, claude-haiku-4-5-20251001)."""
    for model in models:
        entry = prices.get(model) or prices.get(_SNAPSHOT.sub("", model))
        if entry is not None:
            return entry
    return None


def cost(prices: Mapping[str, tuple[Decimal, Decimal]], model: str, input_tokens: int,
         output_tokens: int, answered_model: str | None = None) -> Decimal | None:
    """Dollars for one call, or None when the model has no price."""
    entry = price_of(prices, model, *([answered_model] if answered_model else []))
    if entry is None:
        return None
    return (entry[0] * input_tokens + entry[1] * output_tokens) / PER_MILLION
