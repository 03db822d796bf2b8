"""Placement's query-string languages, parsed into plain values the routes filter by."""

from __future__ import annotations

import uuid
from collections.abc import Sequence, Set

from loadmaster.errors import ValidationError
from loadmaster.microversions import Version
from loadmaster.resources.selectors import MemberOf, Required

MEMBER_OF_SINCE = (1, 3)  # member_of=in:A,B
MEMBER_OF_REPEATED_SINCE = (1, 24)  # several member_of, all must hold
MEMBER_OF_FORBIDDEN_SINCE = (1, 32)  # member_of=!A or !in:A,B
RESOURCES_SINCE = (1, 4)  # resources=VCPU:2,MEMORY_MB:1024
IN_TREE_SINCE = (1, 14)
REQUIRED_SINCE = (1, 18)  # required=A,B on GET /resource_providers
REQUIRED_CANDIDATES_SINCE = (1, 17)  # required=A,B on GET /allocation_candidates, a step earlier
REQUIRED_FORBIDDEN_SINCE = (1, 22)  # required=!A
REQUIRED_ANY_SINCE = (1, 39)  # required=in:A,B, and several required params


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


def member_of(
    values: Sequence[str], version: Version, since: tuple[int, int] = MEMBER_OF_SINCE
) -> MemberOf:
    """Every ``member_of`` value of a request, as the request's microversion allows
    (``since``: the version the route gained ``member_of``)."""
    if values and not version.matches(*since):
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
                "Multiple values for 'member_of' must be prefixed with the 'in:' or '!in:' "
                "keyword using the valid microversion. "
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


def unmatched(name: str, patterns: Sequence[str] = ()) -> ValidationError:
    """A parameter none of a route's open-ended name patterns takes (``resources1@``), as
    Placement's schema with ``patternProperties`` says it: jsonschema's words, the
    patterns (Placement's regexes for the request's microversion) sorted and quoted."""
    listed = ", ".join(repr(p) for p in sorted(patterns))
    return ValidationError(
        f"Invalid query string parameters: {name!r} does not match any of the regexes"
        + (f": {listed}" if listed else ""),
        field=f"query.{name}",
    )


def too_new(name: str) -> ValidationError:
    """A parameter the request's microversion does not have, as Placement's schema says it."""
    return ValidationError(
        f"Invalid query string parameters: Additional properties are not allowed "
        f"({name!r} was unexpected)",
        field=f"query.{name}",
    )


def resources(value: str | None, version: Version, known: Set[str]) -> dict[str, int]:
    """``resources=VCPU:2,MEMORY_MB:1024``: the amounts a provider must have room for."""
    if value is None:
        return {}
    if not version.matches(*RESOURCES_SINCE):
        raise too_new("resources")
    if not value:
        raise _bad_resources(
            "Badly formed resources parameter. Expected resources query string parameter in "
            "form: ?resources=VCPU:2,MEMORY_MB:1024. Got: empty string."
        )
    amounts: dict[str, int] = {}
    for item in value.split(","):
        name, colon, amount = item.partition(":")
        if not colon:
            raise _bad_resources(
                "Badly formed resources parameter. Expected resources query string parameter "
                f"in form: ?resources=VCPU:2,MEMORY_MB:1024. Got: {item}."
            )
        try:
            number = int(amount)
        except ValueError:
            raise _bad_resources(
                f"Requested resource {name} expected positive integer amount. Got: {amount}."
            ) from None
        if number < 1:
            raise _bad_resources(f"Requested resource {name} requires amount >= 1. Got: {amount}.")
        if name not in known:
            raise _bad_resources(
                f"Invalid resource class in resources parameter: No such resource class {name}."
            )
        amounts[name] = number
    return amounts


def _bad_resources(detail: str) -> ValidationError:
    return ValidationError(detail, field="query.resources")


def body_too_new(name: str) -> ValidationError:
    """A body field the request's microversion does not have, as Placement's schema says it."""
    return ValidationError(
        f"JSON does not validate: Additional properties are not allowed ({name!r} was unexpected)",
        field=name,
    )


def body_uuid(value: str, name: str) -> str:
    """A body value that must be a uuid (with or without dashes), canonical."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValidationError(
            f"JSON does not validate: {value!r} is not a 'uuid'. Failed validating 'format'",
            field=name,
        ) from None


def known_traits(wanted: Set[str], known: Set[str]) -> None:
    """A trait Placement does not know in ``required`` is refused (400), not matched by none."""
    unknown = sorted(wanted - known)
    if unknown:
        raise ValidationError(f"No such trait(s): {', '.join(unknown)}.", field="query.required")


def required(
    values: Sequence[str], version: Version, since: tuple[int, int] = REQUIRED_SINCE
) -> Required:
    """Every ``required`` value of a request, as its microversion allows (``since``: the
    version the route gained ``required``)."""
    if not values:
        return Required()
    if not version.matches(*since):
        raise too_new("required")
    forbidding = version.matches(*REQUIRED_FORBIDDEN_SINCE)
    form = "HW_CPU_X86_VMX,!CUSTOM_MAGIC" if forbidding else "HW_CPU_X86_VMX,CUSTOM_MAGIC"
    if not version.matches(*REQUIRED_ANY_SINCE):
        # Placement read one ``required`` before 1.39: the last one given.
        values = values[-1:]
        if values[0].startswith("in:"):
            raise ValidationError(
                f"Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' "
                f"only supported since microversion 1.39. Got: {values[0]}",
                field="query.required",
            )
    all_of: set[str] = set()
    any_of: list[frozenset[str]] = []
    none_of: set[str] = set()
    for raw in values:
        value = raw
        grouped = value.startswith("in:") and version.matches(*REQUIRED_ANY_SINCE)
        if grouped:
            value = value[3:]
        names = [n.strip() for n in value.split(",")]  # Placement trims each name
        if not value or any(not n or n == "!" for n in names):
            raise ValidationError(
                "Invalid query string parameters: Expected 'required' parameter value of "
                f"the form: {form}.",
                field="query.required",
            )
        if grouped:
            any_of.append(frozenset(names))
            continue
        for name in names:
            if name.startswith("!"):
                if not forbidding:
                    raise ValidationError(
                        "Invalid query string parameters: Expected 'required' parameter "
                        f"value of the form: {form}. Got: {raw}",
                        field="query.required",
                    )
                none_of.add(name[1:])
            else:
                all_of.add(name)
    return Required(frozenset(all_of), tuple(any_of), frozenset(none_of))
