"""Enums whose values are what users type, with one way to parse them."""

from __future__ import annotations

import enum
import re

from .errors import UnsupportedError


class Choice(enum.Enum):
    """`parse` takes a member or its value (any case) and refuses anything else clearly.

    The error names the choice after the class: `RuleSet` -> "unknown rule set 'x'".
    """

    @classmethod
    def parse(cls, value):
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            label = re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()
            raise UnsupportedError(
                f"unknown {label} {value!r}; use one of: {', '.join(m.value for m in cls)}"
            ) from None
