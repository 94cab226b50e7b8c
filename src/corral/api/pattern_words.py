"""Plain words for the regular expressions some request fields must match: a 422 for such a field
says what was expected in these words instead of printing the expression (an email address's was
260 characters of character classes). `worded(pattern, words)` returns the pattern for `Field(...,
pattern=)` and records its words for `corral.api.app.plain_errors`."""

from __future__ import annotations

WORDS: dict[str, str] = {}


def worded(pattern: str, words: str) -> str:
    WORDS[pattern] = words
    return pattern


# A catalogue entry's name (template, model, environment): "does not match pattern
# ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$" was all `corral template publish 'my model'` said.
NAME_WORDS = "is not a valid name: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
