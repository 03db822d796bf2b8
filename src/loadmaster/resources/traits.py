"""Traits: boolean qualities of a host (a CPU flag, SSD storage, a site label).

The standard names are os-traits' (pinned), as Placement and its clients know them;
``CUSTOM_*`` traits are created on demand.
"""

from __future__ import annotations

import re

import os_traits

from loadmaster.errors import ValidationError

_TRAIT_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_CUSTOM_TRAIT = re.compile(r"^CUSTOM_[A-Z0-9_]+$")

STANDARD_TRAITS: frozenset[str] = frozenset(os_traits.get_traits())


def validate_trait_name(name: object, field: str = "trait") -> str:
    if not isinstance(name, str) or not _TRAIT_NAME.match(name) or len(name) > 255:
        raise ValidationError(
            f"{field} {name!r} is not a trait name: use upper case letters, digits and _",
            field=field,
        )
    return name


def validate_custom_trait(name: object, field: str = "trait") -> str:
    validate_trait_name(name, field)
    assert isinstance(name, str)
    if not _CUSTOM_TRAIT.match(name):
        raise ValidationError(
            f"{field} {name!r} is not a custom trait: it must match CUSTOM_[A-Z0-9_]+", field=field
        )
    return name


# A provider whose inventory the providers of its aggregates draw from (a storage pool
# several hosts mount), as Placement marks one.
SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"
