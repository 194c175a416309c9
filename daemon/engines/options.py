"""Engine options, declared once by each engine: what a client may tune, its type, range, default
and one line of help. Every front-end validates against these declarations (``validate``), and
``voices`` lists them, so an option an engine takes can never be missing from a protocol."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class OptionError(ValueError):
    """An option value a client sent is wrong; the message names the option."""


@dataclass(frozen=True)
class Option:
    name: str
    type: type  # float, int or bool
    help: str
    lo: float | None = None
    hi: float | None = None
    default: Any = None  # None: the bundle's own default

    def check(self, value: Any) -> Any:
        """The value as the engine takes it, or OptionError saying what is allowed."""
        if self.type is bool:
            if not isinstance(value, bool):
                raise OptionError(f"{self.name} must be true or false")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OptionError(f"{self.name} must be a number")
        if self.type is int:
            if isinstance(value, float) and not value.is_integer():
                raise OptionError(f"{self.name} must be an integer")
            value = int(value)
        elif not math.isfinite(value):  # (a huge int overflows isfinite)
            raise OptionError(f"{self.name} must be a finite number")
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise OptionError(f"{self.name} must be within {self.lo}..{self.hi}, got {value}")
        return self.type(value)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"name": self.name, "type": self.type.__name__, "help": self.help}
        if self.lo is not None:
            info["min"], info["max"] = self.lo, self.hi
        if self.default is not None:
            info["default"] = self.default
        return info


def validate(options: tuple[Option, ...], values: Any) -> dict[str, Any]:
    """A client's option values, checked against an engine's declarations."""
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise OptionError("params must be an object")
    known = {o.name: o for o in options}
    out: dict[str, Any] = {}
    for name, value in values.items():
        option = known.get(name)
        if option is None:
            names = ", ".join(sorted(known)) or "none"
            raise OptionError(f"unknown param {name!r} (this engine takes: {names})")
        if value is not None:
            out[name] = option.check(value)
    return out
