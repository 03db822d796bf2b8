"""Placement's query-string languages, parsed into plain values the routes filter by."""

from __future__ import annotations

import uuid
from collections.abc import Sequence, Set
from dataclasses import dataclass

from loadmaster.errors import ValidationError
from loadmaster.microversions import Version

MEMBER_OF_SINCE = (1, 3)  # member_of=in:A,B
MEMBER_OF_REPEATED_SINCE = (1, 24)  # several member_of, all must hold
MEMBER_OF_FORBIDDEN_SINCE = (1, 32)  # member_of=!A or !in:A,B


@dataclass(frozen=True)
class MemberOf:
    """``any_of``: each set must share an aggregate with the provider; ``none_of``: the
    provider must be in none of these."""

    any_of: tuple[frozenset[str], ...] = ()
    none_of: frozenset[str] = frozenset()

    def admits(self, aggregates: Set[str]) -> bool:
        return all(aggregates & wanted for wanted in self.any_of) and not (
            aggregates & self.none_of
        )


def _bad(detail: str) -> ValidationError:
    return ValidationError(f"Invalid query string parameters: {detail}", field="query.member_of")


def uuid_param(value: str, name: str) -> str:
    """A query value that must be a uuid, canonical."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValidationError(
            f"Invalid query string parameters: '{value}' is not a 'uuid'", field=f"query.{name}"
        ) from None


def _uuids(text: str, raw: str) -> frozenset[str]:
    found = set()
    for item in text.split(","):
        try:
            found.add(str(uuid.UUID(item)))
        except ValueError:
            raise _bad(
                f"Expected 'member_of' parameter to contain valid UUID(s). Got: {raw}"
            ) from None
    return frozenset(found)


def member_of(values: Sequence[str], version: Version) -> MemberOf:
    """Every ``member_of`` value of a request, as the request's microversion allows."""
    if values and not version.matches(*MEMBER_OF_SINCE):
        raise _bad("Additional properties are not allowed ('member_of' was unexpected)")
    if len(values) > 1 and not version.matches(*MEMBER_OF_REPEATED_SINCE):
        raise _bad("Multiple member_of parameters are not supported")
    any_of: list[frozenset[str]] = []
    none_of: set[str] = set()
    for raw in values:
        value = raw
        forbidden = value.startswith("!")
        if forbidden:
            if not version.matches(*MEMBER_OF_FORBIDDEN_SINCE):
                raise _bad(
                    "Forbidden member_of parameters are not supported in the specified "
                    f"microversion. Got: {raw}"
                )
            value = value[1:]
        if value.startswith("in:"):
            value = value[3:]
        elif "," in value:
            raise _bad(
                "Multiple values for 'member_of' must be prefixed with the 'in:' keyword. "
                f"Got: {raw}"
            )
        if forbidden and value.startswith("!"):
            raise _bad(f"Expected 'member_of' parameter to contain valid UUID(s). Got: {raw}")
        uuids = _uuids(value, raw)
        if forbidden:
            none_of |= uuids
        else:
            any_of.append(uuids)
    return MemberOf(tuple(any_of), frozenset(none_of))
