"""Resource classes, traits, inventories and requirements: pure rules, no storage."""

from loadmaster.resources.classes import (
    CUSTOM_PREFIX,
    STANDARD_BY_NAME,
    STANDARD_CLASSES,
    ResourceClass,
    class_order,
    in_class_order,
    validate_custom_name,
)
from loadmaster.resources.inventory import Inventory, parse_amounts, summed
from loadmaster.resources.requirements import (
    UNKNOWN_SPECS,
    FlavorSpec,
    UnknownSpecs,
    aggregate_specs,
    extra_spec_names,
    one_numa_node,
    parse_flavor,
    pci_numa_affinity,
)
from loadmaster.resources.traits import STANDARD_TRAITS, validate_custom_trait, validate_trait_name

__all__ = [
    "CUSTOM_PREFIX",
    "STANDARD_BY_NAME",
    "STANDARD_CLASSES",
    "STANDARD_TRAITS",
    "UNKNOWN_SPECS",
    "FlavorSpec",
    "Inventory",
    "ResourceClass",
    "UnknownSpecs",
    "aggregate_specs",
    "class_order",
    "extra_spec_names",
    "in_class_order",
    "one_numa_node",
    "parse_amounts",
    "parse_flavor",
    "pci_numa_affinity",
    "summed",
    "validate_custom_name",
    "validate_custom_trait",
    "validate_trait_name",
]
