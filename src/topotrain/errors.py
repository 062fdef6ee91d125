"""The one error type users see: a bad input, named by its field, with the fix."""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid user input. ``field`` is the dotted path of the offending field (may be empty).

    The CLI prints ``str(error)`` as a single line and exits with status 2.
    """

    def __init__(self, field: str, message: str, fix: str = "") -> None:
        self.field = field
        self.message = message
        self.fix = fix
        text = f"{field}: {message}" if field else message
        if fix:
            text += f" ({fix})"
        super().__init__(text)
