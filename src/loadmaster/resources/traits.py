"""Traits: boolean qualities of a host (a CPU flag, SSD storage, a site label).

Standard names follow os-traits for the ones operators use most; ``CUSTOM_*`` traits
are created on demand.
"""

from __future__ import annotations

import re

from loadmaster.errors import ValidationError

_TRAIT_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_CUSTOM_TRAIT = re.compile(r"^CUSTOM_[A-Z0-9_]+$")

STANDARD_TRAITS: frozenset[str] = frozenset(
    {
        "HW_CPU_X86_AVX",
        "HW_CPU_X86_AVX2",
        "HW_CPU_X86_AVX512F",
        "HW_CPU_X86_SSE42",
        "HW_CPU_X86_AESNI",
        "HW_CPU_X86_SGX",
        "HW_CPU_X86_AMD_SEV",
        "HW_CPU_HYPERTHREADING",
        "HW_CPU_AARCH64_SVE",
        "HW_NIC_SRIOV",
        "HW_NIC_OFFLOAD_TSO",
        "HW_GPU_API_VULKAN",
        "HW_GPU_API_OPENGL_4_6",
        "HW_NUMA_ROOT",
        "STORAGE_DISK_SSD",
        "STORAGE_DISK_HDD",
        "COMPUTE_STATUS_DISABLED",
        "COMPUTE_VOLUME_MULTI_ATTACH",
        "COMPUTE_TRUSTED_CERTS",
        "COMPUTE_NET_ATTACH_INTERFACE",
        "MISC_SHARES_VIA_AGGREGATE",
    }
)


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
