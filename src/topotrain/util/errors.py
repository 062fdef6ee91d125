"""The one error type users see: a bad input, named by its field, with the fix."""

from __future__ import annotations

import difflib
from collections.abc import Sequence


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


class ConfigErrors(ConfigError):
    """Several invalid inputs found at once (a scenario is checked whole, not stopped at its first fault).

    ``problems`` holds one :class:`ConfigError` per fault; ``str()`` is one line per problem, so code that
    prints a ConfigError shows them all. The CLI prints each as its own ``error:`` line.
    """

    problems: list[ConfigError]

    def __init__(self, problems: list[ConfigError]) -> None:
        flat: list[ConfigError] = []
        for p in problems:
            flat.extend(p.problems if isinstance(p, ConfigErrors) else [p])
        if not flat:
            raise ValueError("ConfigErrors needs at least one problem")
        first = flat[0]
        super().__init__(first.field, first.message, first.fix)
        self.problems = flat
        self.args = ("\n".join(str(p) for p in flat),)

    def __str__(self) -> str:
        return "\n".join(ConfigError.__str__(p) if not isinstance(p, ConfigErrors) else str(p)
                         for p in self.problems)


def problems_of(error: ConfigError) -> list[ConfigError]:
    """The individual problems of a ConfigError (itself, or each of a :class:`ConfigErrors`)."""
    return list(error.problems) if isinstance(error, ConfigErrors) else [error]


def did_you_mean(value: object, known: Sequence[str]) -> str:
    """The fix for an unknown name: ``did you mean 'flow'? known: analytical, flow, ...`` (the closest name by
    difflib's ratio, where one is close; then every known name)."""
    near = difflib.get_close_matches(str(value).strip().lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    spelled = {k.lower(): k for k in known}
    head = f"did you mean {spelled[near[0]]!r}? " if near else ""
    return f"{head}known: {', '.join(known)}"
