"""What a request to the search server asks: query-string parameters decoded strictly (malformed UTF-8,
repeated or unknown keys, control characters and values out of bounds are each a 400 naming the parameter),
and :class:`BadRequest`, the 4xx / 5xx a route answers with."""

import re
from urllib.parse import parse_qsl

from patchword.search.results import QueryError, check_query_text

__all__ = ["ID", "BadRequest", "QueryParams"]

#: An index id as a request writes it.
ID = re.compile(r"[0-9]{1,12}")


class BadRequest(Exception):
    """A request answered with ``status`` and ``{"error": message}``, plus the fields of ``extra`` (a 409's
    ``version``)."""

    def __init__(self, status: int, message: str, **extra: object) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


class QueryParams:
    """Query-string parameters decoded strictly (malformed UTF-8 and repeated keys are errors)."""

    def __init__(self, raw: bytes, allowed: tuple[str, ...]) -> None:
        try:
            text = raw.decode("utf-8", errors="strict")
            pairs = parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict")
        except UnicodeDecodeError as err:
            raise BadRequest(400, "the query string is not valid UTF-8") from err
        except ValueError as err:
            raise BadRequest(400, f"malformed query string: {err}") from err
        self.values: dict[str, str] = {}
        for key, value in pairs:
            # A misspelt parameter (``top_k=5``) must not answer as if it were not there (k=10).
            if key not in allowed:
                takes = f"takes {', '.join(allowed)}" if allowed else "takes no parameters"
                raise BadRequest(400, f"unknown parameter {key[:40]!r} (this endpoint {takes})")
            if key in self.values:
                raise BadRequest(400, f"parameter {key!r} is given more than once")
            self.values[key] = value

    def text(self, key: str, max_chars: int) -> str:
        value = self.values.get(key)
        if value is None:
            raise BadRequest(400, f"missing parameter {key!r}")
        # Before stripping: strip() would silently drop a trailing newline (and \x1c-\x1f, \x85).
        try:
            check_query_text(value, f"parameter {key!r}")
        except QueryError as err:
            raise BadRequest(400, str(err)) from err
        value = value.strip()
        if not value:
            raise BadRequest(400, f"parameter {key!r} is empty")
        if len(value) > max_chars:
            raise BadRequest(400, f"parameter {key!r} is longer than {max_chars} characters")
        return value

    def integer(self, key: str, low: int, high: int, default: int | None = None) -> int:
        value = self.values.get(key)
        if value is None:
            if default is None:
                raise BadRequest(400, f"missing parameter {key!r}")
            return default
        stripped = value.strip()
        if not re.fullmatch(r"-?[0-9]+", stripped):
            raise BadRequest(400, f"parameter {key!r} must be an integer, got {value[:40]!r}")
        # An integer too long to parse cheaply is out of any bound a route sets: said so, not "not an integer"
        number = int(stripped) if len(stripped) <= 40 else None
        if number is None or not low <= number <= high:
            shown = stripped if number is not None else stripped[:40] + "..."
            raise BadRequest(400, f"parameter {key!r} must lie in [{low}, {high}], got {shown}")
        return number
