"""PCI aliases: the names flavors ask for host devices by (``pci_passthrough:alias=a1:2``),
as Nova's ``[pci] alias`` with PCI-in-Placement.

The server's ``LOADMASTER_PCI_ALIASES`` is a JSON list of aliases::

    [{"name": "vf-physnet1", "vendor_id": "8086", "product_id": "10ed",
      "traits": ["CUSTOM_PHYSNET1"]},
     {"name": "vf2", "resource_class": "CUSTOM_VF_PHYSNET2"}]

An alias names the class its devices are offered as (``resource_class``, else
``CUSTOM_PCI_<VENDOR>_<PRODUCT>``, the class an agent's device spec gives them by default)
and the traits their provider must have. A flavor asking ``N`` of an alias asks ``N`` of
its class and requires its traits.

As Nova's, an alias may say ``device_type`` (``type-PCI``, ``type-PF`` or ``type-VF``):
the agents tag each device provider with the kind of devices it gives
(``DEVICE_TYPE_TRAITS``), and the alias requires that trait. ``numa_policy``
(``required``, ``preferred`` or ``legacy``) is the ``hw:pci_numa_affinity_policy`` of
flavors asking the alias that set none of their own. ``socket`` is refused: the agents
register NUMA nodes, not the sockets they sit on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadmaster.errors import ValidationError
from loadmaster.resources.classes import STANDARD_BY_NAME, validate_custom_name
from loadmaster.resources.traits import validate_trait_name
from loadmaster.resources.tree_fit import AFFINITIES, Affinity

ALIAS_SPEC = "pci_passthrough:alias"
_KEYS = (
    "name",
    "resource_class",
    "vendor_id",
    "product_id",
    "traits",
    "device_type",
    "numa_policy",
)
# The trait an agent gives a device provider by what its devices are (a PF's VFs: type-VF).
DEVICE_TYPE_TRAITS = {
    "type-PCI": "CUSTOM_PCI_DEVICE_TYPE_PCI",
    "type-PF": "CUSTOM_PCI_DEVICE_TYPE_PF",
    "type-VF": "CUSTOM_PCI_DEVICE_TYPE_VF",
}
_HEX4 = re.compile(r"^[0-9a-fA-F]{4}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class PciAlias:
    name: str
    resource_class: str
    traits: frozenset[str] = frozenset()
    numa_policy: Affinity | None = None


def parse_aliases(text: str, where: str = "pci_aliases") -> dict[str, PciAlias]:
    """The aliases of ``LOADMASTER_PCI_ALIASES`` by name; an error names the entry and
    field (``pci_aliases[1].vendor_id``) and why."""
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{where} is not JSON: {exc}", field=where) from None
    if not isinstance(raw, list):
        raise ValidationError(f"{where} must be a JSON list of aliases", field=where)
    aliases: dict[str, PciAlias] = {}
    for i, entry in enumerate(raw):
        at = f"{where}[{i}]"
        entry = checked_entry(entry, _KEYS, at, shape="an object", what="an alias")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValidationError(
                f"{at}.name must be 1-64 letters, digits, '.', '_' or '-', got {name!r}",
                field=f"{at}.name",
            )
        if name in aliases:
            raise ValidationError(f"{at}.name: alias {name} is defined twice", field=f"{at}.name")
        rc = entry.get("resource_class")
        if rc is not None:
            resource_class = (
                rc if rc in STANDARD_BY_NAME else validate_custom_name(rc, f"{at}.resource_class")
            )
        else:
            ids = []
            for key in ("vendor_id", "product_id"):
                value = entry.get(key)
                if not isinstance(value, str) or not _HEX4.match(value.removeprefix("0x")):
                    raise ValidationError(
                        f"{at}.{key} must be four hex digits when the alias names no "
                        f"resource_class, got {value!r}",
                        field=f"{at}.{key}",
                    )
                ids.append(value.removeprefix("0x").upper())
            resource_class = f"CUSTOM_PCI_{ids[0]}_{ids[1]}"
        traits = entry.get("traits", [])
        if not isinstance(traits, list):
            raise ValidationError(
                f"{at}.traits must be a list of trait names", field=f"{at}.traits"
            )
        named = {validate_trait_name(t, f"{at}.traits[{j}]") for j, t in enumerate(traits)}
        kind = entry.get("device_type")
        if kind is not None:
            if kind not in DEVICE_TYPE_TRAITS:
                raise ValidationError(
                    f"{at}.device_type must be {', '.join(DEVICE_TYPE_TRAITS)}, got {kind!r}",
                    field=f"{at}.device_type",
                )
            named.add(DEVICE_TYPE_TRAITS[kind])
        aliases[name] = PciAlias(
            name, resource_class, frozenset(named), _numa_policy(entry, f"{at}.numa_policy")
        )
    return aliases


def checked_entry(
    entry: object, known: Sequence[str], at: str, *, shape: str, what: str, where: str = ""
) -> Mapping[str, Any]:
    """One entry of a list of PCI settings (an alias, an agent's device spec) as a mapping
    of ``known`` fields only; else an error naming ``at`` (``shape``: what it must be) or
    its first unknown field. ``where``, when given, opens the message (the file)."""
    opening = f"{where}: " if where else ""
    if not isinstance(entry, Mapping):
        raise ValidationError(f"{opening}{at} must be {shape}", field=at)
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise ValidationError(
            f"{opening}{at}.{unknown[0]} is not {what} field (known: {', '.join(known)})",
            field=f"{at}.{unknown[0]}",
        )
    return entry


def _numa_policy(entry: Mapping[str, object], where: str) -> Affinity | None:
    policy = entry.get("numa_policy")
    if policy is None:
        return None
    if policy == "socket":
        raise ValidationError(
            f"{where}=socket is refused: the agents register NUMA nodes, not the sockets "
            "they sit on (required, preferred or legacy)",
            field=where,
        )
    chosen = next((a for a in AFFINITIES if a == policy), None)
    if chosen is None:
        raise ValidationError(
            f"{where} must be {', '.join(AFFINITIES)}, got {policy!r}", field=where
        )
    return chosen


def alias_requests(
    value: str, aliases: Mapping[str, PciAlias], where: str = f"extra_specs.{ALIAS_SPEC}"
) -> list[tuple[PciAlias, int]]:
    """``a1:2,a2`` as (alias, count) pairs (a count left out is 1); an alias the server
    does not define is refused naming it."""
    out = []
    for part in value.split(","):
        name, colon, count_text = part.strip().partition(":")
        if not name:
            raise ValidationError(f"{where} must be NAME[:COUNT],..., got {value!r}", field=where)
        if name not in aliases:
            known = ", ".join(sorted(aliases)) or "none are defined (LOADMASTER_PCI_ALIASES)"
            raise ValidationError(f"{where}: no PCI alias {name} (known: {known})", field=where)
        try:
            count = int(count_text) if colon else 1
        except ValueError:
            count = 0
        if count < 1:
            raise ValidationError(
                f"{where}: the count of alias {name} must be an integer of at least 1, "
                f"got {count_text!r}",
                field=where,
            )
        out.append((aliases[name], count))
    return out
