"""Placement's allocations: ``/allocations/{consumer_uuid}``, ``POST /allocations`` (1.13),
a provider's allocations and the per-project usages, every body form each microversion
has. Writes go through the one ledger (``pending.consumers``): pending records count as
used in every capacity check, and a VM's consumer keeps the VM's rules.

This module holds Placement's allocation routes, in every
microversion's body form."""

from __future__ import annotations

import re
import uuid as uuidlib
from typing import Any

from fastapi import APIRouter, Body, Query, Request, Response

from loadmaster.api import microversion, queries
from loadmaster.api.deps import LM
from loadmaster.api.responses import (
    CandidatesOut,
    ConsumerAllocationsOut,
    ProviderAllocationsOut,
    UsagesOut,
)
from loadmaster.api.routes.providers import PROVIDER
from loadmaster.api.schemas import ReshaperIn
from loadmaster.cluster.host_rows import parse_inventories
from loadmaster.errors import (
    BadQueryValue,
    DuplicateQueryKey,
    MissingQueryValue,
    NotFound,
    ValidationError,
)
from loadmaster.microversions import Version
from loadmaster.pending.candidates import RequestGroup
from loadmaster.pending.consumers import UNCHECKED, ConsumerWrite
from loadmaster.pending.reshape import ProviderInventories
from loadmaster.resources import in_class_order, summed
from loadmaster.service import Loadmaster

router = APIRouter(tags=["allocations"])

DICT_FORM_SINCE = (1, 12)  # allocations keyed by provider uuid; project and user shown
OWNER_REQUIRED_SINCE = (1, 8)  # project_id and user_id required in writes
POST_SINCE = microversion.since(1, 13)
RESHAPER_SINCE = microversion.since(1, 30)
CONSUMER_GENERATION_SINCE = (1, 28)
MAPPINGS_SINCE = (1, 34)
CONSUMER_TYPE_SINCE = (1, 38)
USAGES_SINCE = microversion.since(1, 9)
# The owner Placement gives a consumer written without one (before 1.8): its
# ``incomplete_consumer_project_id`` and ``..._user_id`` defaults.
INCOMPLETE_CONSUMER = "00000000-0000-0000-0000-000000000000"
# Placement's schema for a class name in an allocation: standard or custom, upper case.
CLASS_NAME = re.compile(r"^[A-Z0-9_]+$")


@router.get(
    "/allocations/{consumer_uuid}",
    response_model=ConsumerAllocationsOut,
    response_model_exclude_unset=True,
)
def get_allocations(lm: LM, consumer_uuid: str) -> dict[str, Any]:
    version = microversion.current()
    found = lm.allocations.consumer(consumer_uuid)
    allocations = found.allocations if found is not None else {}
    view: dict[str, Any] = {"allocations": allocations}
    if found is not None and allocations and version.matches(*DICT_FORM_SINCE):
        view["project_id"] = found.project_id
        view["user_id"] = found.user_id
        if version.matches(*CONSUMER_GENERATION_SINCE):
            view["consumer_generation"] = found.generation
        if version.matches(*CONSUMER_TYPE_SINCE):
            view["consumer_type"] = found.consumer_type
    return view


@router.put("/allocations/{consumer_uuid}", status_code=204)
def put_allocations(lm: LM, consumer_uuid: str, body: Any = Body(...)) -> Response:
    """Replace the consumer's allocations (empty: remove them)."""
    lm.allocations.write_consumers([_parse(consumer_uuid, body, "", empty_ok=False)])
    return Response(status_code=204)


@router.post("/allocations", status_code=204, openapi_extra=POST_SINCE)
def post_allocations(lm: LM, body: Any = Body(...)) -> Response:
    """Many consumers' allocations in one transaction, all or none."""
    if not isinstance(body, dict) or not body:
        raise _invalid("the body must map consumer uuids to their allocations", "body")
    writes = [_parse(uuid, item, f"{uuid}.", empty_ok=True) for uuid, item in body.items()]
    lm.allocations.write_consumers(writes)
    return Response(status_code=204)


@router.post("/reshaper", status_code=204, openapi_extra=RESHAPER_SINCE)
def reshaper(lm: LM, body: ReshaperIn) -> Response:
    """Replace providers' inventories and consumers' allocations in one transaction, so
    usage moves between providers with no moment allocated from a missing inventory."""
    inventories = [
        ProviderInventories(
            queries.body_uuid(uuid, f"inventories.{uuid}"),
            item.resource_provider_generation,
            parse_inventories(
                item.inventories,
                f"inventories.{uuid}.inventories",
            ),
        )
        for uuid, item in body.inventories.items()
    ]
    writes = [
        _parse(uuid, item, f"allocations.{uuid}.", empty_ok=True)
        for uuid, item in body.allocations.items()
    ]
    lm.allocations.reshape(inventories, writes)
    return Response(status_code=204)


@router.delete("/allocations/{consumer_uuid}", status_code=204)
def delete_allocations(lm: LM, consumer_uuid: str) -> Response:
    found = lm.allocations.consumer(consumer_uuid)
    if found is None or not found.allocations:
        raise NotFound(f"No allocations for consumer '{consumer_uuid}'", field="consumer_uuid")
    write = ConsumerWrite(consumer_uuid, {}, found.project_id, found.user_id)
    lm.allocations.write_consumers([write])
    return Response(status_code=204)


@router.get(
    PROVIDER + "/allocations",
    response_model=ProviderAllocationsOut,
    response_model_exclude_unset=True,
)
def provider_allocations(lm: LM, provider: str) -> dict[str, Any]:
    generation, held = lm.allocations.provider_allocations(provider)
    with_generation = microversion.current().matches(*CONSUMER_GENERATION_SINCE)
    allocations: dict[str, Any] = {}
    for uuid, holding in held.items():
        entry: dict[str, Any] = {"resources": holding.resources}
        if with_generation:
            entry["consumer_generation"] = holding.consumer_generation
        allocations[uuid] = entry
    return {"resource_provider_generation": generation, "allocations": allocations}


@router.get("/usages", openapi_extra=USAGES_SINCE, response_model=UsagesOut)
def usages(
    lm: LM,
    project_id: str,
    user_id: str | None = None,
    consumer_type: str | None = Query(None, description="from 1.38: a type, all or unknown"),
) -> dict[str, Any]:
    """What a project's (and user's) consumers hold, pending claims included."""
    version = microversion.current()
    for name, value in (("project_id", project_id), ("user_id", user_id)):
        if value is not None and not 1 <= len(value) <= 255:
            raise ValidationError(
                f"Invalid query string parameters: {value!r} is not 1 to 255 characters. "
                f"Failed validating '{'minLength' if not value else 'maxLength'}'",
                field=f"query.{name}",
            )
    if consumer_type is not None and not version.matches(*CONSUMER_TYPE_SINCE):
        raise ValidationError(
            "Invalid query string parameters: Additional properties are not allowed "
            "('consumer_type' was unexpected)",
            field="query.consumer_type",
        )
    by_type = lm.allocations.consumer_usages(project_id, user_id, consumer_type)
    if version.matches(*CONSUMER_TYPE_SINCE):
        if consumer_type == "all":
            merged = summed(by_type.values())
            return {"usages": {"all": merged} if merged else {}}
        return {"usages": by_type}
    # Before 1.38: one set of amounts for every type, and no consumer count.
    flat = summed(by_type.values())
    flat.pop("consumer_count", None)
    return {"usages": flat}


def _parse(consumer: str, body: Any, where: str, *, empty_ok: bool) -> ConsumerWrite:
    """One consumer's write in the form its microversion has. ``empty_ok``: empty
    allocations remove the consumer's (``POST``; ``PUT`` from 1.28)."""
    version = microversion.current()
    try:
        consumer = str(uuidlib.UUID(consumer))
    except ValueError:
        raise ValidationError(
            f"Malformed consumer_uuid: {consumer!r} is not a uuid", field=where + "consumer_uuid"
        ) from None
    empty_ok = empty_ok or version.matches(*CONSUMER_GENERATION_SINCE)
    if not isinstance(body, dict):
        raise _invalid(f"{body!r} is not of type 'object'", where or "body")
    known = {"allocations", "project_id", "user_id"}
    if version.matches(*CONSUMER_GENERATION_SINCE):
        known.add("consumer_generation")
    if version.matches(*MAPPINGS_SINCE):
        known.add("mappings")
    if version.matches(*CONSUMER_TYPE_SINCE):
        known.add("consumer_type")
    extra = sorted(set(body) - known)
    if extra:
        raise _invalid(
            f"Additional properties are not allowed ({extra[0]!r} was unexpected)", where + extra[0]
        )
    required = ["allocations"]
    if version.matches(*OWNER_REQUIRED_SINCE):
        required += ["project_id", "user_id"]
    if version.matches(*CONSUMER_GENERATION_SINCE):
        required.append("consumer_generation")
    if version.matches(*CONSUMER_TYPE_SINCE):
        required.append("consumer_type")
    for name in required:
        if name not in body:
            raise _invalid(f"{name!r} is a required property", where + name, "required")
    allocations = _allocations(body["allocations"], version.matches(*DICT_FORM_SINCE), where)
    if not allocations and not empty_ok:
        raise _invalid(
            "{} does not have enough properties (should be non-empty)",
            where + "allocations",
            "minProperties",
        )
    if "mappings" in body:
        _mappings(body["mappings"], where + "mappings")
    generation = body.get("consumer_generation", UNCHECKED)
    if generation is not None and not isinstance(generation, int):
        raise _invalid(f"{generation!r} is not of type 'integer'", where + "consumer_generation")
    return ConsumerWrite(
        consumer,
        allocations,
        _text(body.get("project_id", INCOMPLETE_CONSUMER), where + "project_id"),
        _text(body.get("user_id", INCOMPLETE_CONSUMER), where + "user_id"),
        generation,
        _consumer_type(body["consumer_type"], where + "consumer_type")
        if "consumer_type" in body
        else None,
    )


def _consumer_type(value: Any, field: str) -> str:
    """A consumer type as Placement's schema takes it: upper-case letters, digits, ``_``."""
    text = _text(value, field)
    if not CLASS_NAME.match(text):
        raise _invalid(f"{text!r} does not match {CLASS_NAME.pattern!r}", field, "pattern")
    return text


def _mappings(raw: Any, field: str) -> None:
    """``mappings`` (1.34) as Placement's schema judges it: request group suffixes to
    non-empty lists of provider uuids. loadmaster keeps no mappings; a malformed one is
    still refused, before any generation is compared, as Placement refuses it."""
    if not isinstance(raw, dict):
        raise _invalid(f"{raw!r} is not of type 'object'", field, "type")
    if not raw:
        raise _invalid(
            "{} does not have enough properties (should be non-empty)", field, "minProperties"
        )
    for suffix, uuids in raw.items():
        # Placement's pattern is unanchored: a key with any such character is a group.
        if not _GROUP_CHAR.search(suffix):
            continue
        where = f"{field}.{suffix}"
        if not isinstance(uuids, list):
            raise _invalid(f"{uuids!r} is not of type 'array'", where, "type")
        if not uuids:
            raise _invalid("[] is too short", where, "minItems")
        for item in uuids:
            if not isinstance(item, str):
                raise _invalid(f"{item!r} is not of type 'string'", where, "type")
            try:
                uuidlib.UUID(item)
            except ValueError:
                raise _invalid(f"{item!r} is not a 'uuid'", where, "format") from None


def _allocations(raw: Any, dict_form: bool, where: str) -> dict[str, dict[str, int]]:
    field = where + "allocations"
    out: dict[str, dict[str, int]] = {}
    if dict_form:
        if not isinstance(raw, dict):
            raise _invalid(f"{raw!r} is not of type 'object'", field)
        items = [(uuid, entry) for uuid, entry in raw.items()]
        for uuid in raw:
            try:
                uuidlib.UUID(uuid)
            except ValueError:
                raise _invalid(
                    f"{uuid!r} does not match any of the regexes: a provider uuid",
                    f"{field}.{uuid}",
                    "additionalProperties",
                ) from None
    else:
        if not isinstance(raw, list):
            raise _invalid(f"{raw!r} is not of type 'array'", field, "type")
        if not raw:
            raise _invalid("[] is too short", field, "minItems")
        items = []
        for entry in raw:
            provider = entry.get("resource_provider") if isinstance(entry, dict) else None
            if not isinstance(provider, dict) or not isinstance(provider.get("uuid"), str):
                raise _invalid("'resource_provider' is a required property", field)
            items.append((provider["uuid"], {"resources": entry.get("resources")}))
    for uuid, entry in items:
        resources = entry.get("resources") if isinstance(entry, dict) else None
        if not isinstance(resources, dict):
            raise _invalid("'resources' is a required property", f"{field}.{uuid}", "required")
        if not resources:
            raise _invalid(
                "{} does not have enough properties (should be non-empty)",
                f"{field}.{uuid}.resources",
                "minProperties",
            )
        for name, amount in resources.items():
            where_amount = f"{field}.{uuid}.{name}"
            if not CLASS_NAME.match(name):
                raise _invalid(
                    f"{name!r} does not match any of the regexes: {CLASS_NAME.pattern!r}",
                    where_amount,
                    "additionalProperties",
                )
            if not isinstance(amount, int) or isinstance(amount, bool):
                raise _invalid(f"{amount!r} is not of type 'integer'", where_amount, "type")
            if amount < 1:
                raise _invalid(f"{amount!r} is less than the minimum of 1", where_amount, "minimum")
        out[uuid] = dict(resources)
    return out


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _invalid(f"{value!r} is not of type 'string'", field, "type")
    if not value:
        raise _invalid(f"{value!r} is too short", field, "minLength")
    if len(value) > 255:
        raise _invalid(f"{value!r} is too long", field, "maxLength")
    return value


def _invalid(message: str, field: str, keyword: str | None = None) -> ValidationError:
    """Placement's words for a body its JSON Schema refuses (``keyword``: the check)."""
    failed = f". Failed validating {keyword!r} in schema" if keyword else ""
    return ValidationError(f"JSON does not validate: {message}{failed}", field=field)


CANDIDATES_SINCE = microversion.since(1, 10)
SUMMARY_TRAITS_SINCE = (1, 17)
LIMIT_SINCE = (1, 16)
GRANULAR_SINCE = (1, 25)  # resources1=..., required1=..., member_of1=..., group_policy
ANY_SUFFIX_SINCE = (1, 33)  # suffixes of letters, digits, _ and -, not only numbers
IN_TREE_CANDIDATES_SINCE = (1, 31)
ROOT_REQUIRED_SINCE = (1, 35)
SAME_SUBTREE_SINCE = (1, 36)
TREE_IN_SUMMARIES_SINCE = (1, 29)
ALL_CLASSES_IN_SUMMARIES_SINCE = (1, 27)
MEMBER_OF_CANDIDATES_SINCE = (1, 21)
CUSTOM_TRAIT_PREFIX = "CUSTOM_"
_NUMBERED = re.compile(r"^[1-9][0-9]*$")  # suffixes before 1.33
_GROUP_CHAR = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # Placement's mappings key pattern
_SUFFIXED = re.compile(r"^(resources|required|member_of|in_tree)([A-Za-z0-9_-]{1,64})$")


def _group_regexes(version: Version) -> list[str]:
    """The name patterns Placement's schema gives request groups at ``version``, which
    its message for a parameter none of them takes lists."""
    kinds = ["resources", "required", "member_of"]
    if version.matches(*IN_TREE_CANDIDATES_SINCE):
        kinds.append("in_tree")
    suffix = "[a-zA-Z0-9_-]{1,64}" if version.matches(*ANY_SUFFIX_SINCE) else "[1-9][0-9]*"
    return [f"^{kind}({suffix})?$" for kind in kinds]


@router.get(
    "/allocation_candidates",
    openapi_extra=CANDIDATES_SINCE,
    response_model=CandidatesOut,
    response_model_exclude_unset=True,
)
def allocation_candidates(
    lm: LM,
    request: Request,
    resources: str | None = Query(None, description="VCPU:2,MEMORY_MB:1024 (the unnumbered group)"),
    required: list[str] = Query([], description="traits: A,B (all), !A (not), in:A,B"),
    member_of: list[str] = Query([], description="aggregates: in:A,B, !A, repeated: all"),
    in_tree: str | None = Query(None, description="only this provider's tree (1.31)"),
    limit: list[str] = Query([], description="at most this many candidates (1.16); the first"),
    group_policy: list[str] = Query(
        [], description="none or isolate: may numbered groups share a provider (1.25); the first"
    ),
    root_required: list[str] = Query([], description="traits of the root: A,!B (1.35), once"),
    same_subtree: list[str] = Query(
        [], description="suffixes whose providers form one subtree: _A,_B (1.36)"
    ),
) -> dict[str, Any]:
    """Where the request groups could be allocated now (pending claims counted as used):
    one host's provider tree each, with sharing providers it reaches through an aggregate.
    Numbered groups (``resources1=...`` and their ``required1``, ``member_of1``,
    ``in_tree1``; 1.25) each come from one provider."""
    version = microversion.current()
    most = _limit(limit, version)
    subtrees = [[name.strip() for name in value.split(",")] for value in same_subtree]
    if subtrees and not version.matches(*SAME_SUBTREE_SINCE):
        raise queries.too_new("same_subtree")
    if any("" in names for names in subtrees):
        raise BadQueryValue(
            "Empty string (unsuffixed group) can not be specified in `same_subtree` ",
            field="query.same_subtree",
        )
    groups, traits = _request_groups(lm, request, version, subtrees)
    policy = group_policy[0] if group_policy else None
    if len([g for g in groups if g.suffix]) > 1 and policy is None:
        raise ValidationError(
            'The "group_policy" parameter is required when specifying more than one '
            '"resources{N}" parameter.',
            field="query.group_policy",
        )
    if policy is not None:
        if not version.matches(*GRANULAR_SINCE):
            raise queries.too_new("group_policy")
        if policy not in ("none", "isolate"):
            raise ValidationError(
                f"Invalid query string parameters: {policy!r} is not one of ['none', 'isolate']",
                field="query.group_policy",
            )
    root = None
    if root_required:
        if not version.matches(*ROOT_REQUIRED_SINCE):
            raise queries.unmatched("root_required", _group_regexes(version))
        if len(root_required) > 1:
            raise DuplicateQueryKey(
                "Query parameter 'root_required' may be specified only once.",
                field="query.root_required",
            )
        root = queries.required(root_required, version)
        both = sorted(root.all_of & root.none_of)
        if both:
            raise BadQueryValue(
                "Conflicting required and forbidden traits found in root_required: "
                + ", ".join(both),
                field="query.root_required",
            )
        traits |= root.names()
    if traits:
        queries.known_traits(traits, set(lm.traits.list(names=traits)))
    found = lm.allocations.candidates(
        groups,
        isolate=policy == "isolate",
        root_ok=root.admits if root is not None else None,
        same_subtree=subtrees,
        limit=most,
        nested_aware=version.matches(*TREE_IN_SUMMARIES_SINCE),
    )
    dict_form = version.matches(*DICT_FORM_SINCE)
    requests: list[dict[str, Any]] = []
    for candidate in found.requests:
        if dict_form:
            entry: dict[str, Any] = {
                "allocations": {u: {"resources": r} for u, r in candidate.allocations.items()}
            }
            if version.matches(*MAPPINGS_SINCE):
                entry["mappings"] = candidate.mappings
            requests.append(entry)
        else:
            requests.append(
                {
                    "allocations": [
                        {"resource_provider": {"uuid": u}, "resources": r}
                        for u, r in candidate.allocations.items()
                    ]
                }
            )
    in_requests = {u for c in found.requests for u in c.allocations}
    # Before 1.27 a summary shows only the classes the request names.
    shown = (
        None
        if version.matches(*ALL_CLASSES_IN_SUMMARIES_SINCE)
        else summed(g.amounts for g in groups)
    )
    summaries: dict[str, Any] = {}
    for uuid, provider in found.providers.items():
        if uuid not in in_requests and not version.matches(*TREE_IN_SUMMARIES_SINCE):
            continue
        summary: dict[str, Any] = {
            "resources": {
                name: {"capacity": inv.capacity, "used": provider.used.get(name, 0)}
                for name, inv in in_class_order(provider.inventories).items()
                if shown is None or name in shown
            }
        }
        if version.matches(*SUMMARY_TRAITS_SINCE):
            # Placement's order: its standard traits (made first) before custom ones.
            summary["traits"] = sorted(
                provider.traits, key=lambda t: (t.startswith(CUSTOM_TRAIT_PREFIX), t)
            )
        if version.matches(*TREE_IN_SUMMARIES_SINCE):
            summary["parent_provider_uuid"] = provider.parent_uuid
            summary["root_provider_uuid"] = found.roots[provider.id]
        summaries[uuid] = summary
    if not dict_form:
        return {
            "allocation_requests": requests,
            "provider_summaries": {u: {"resources": s["resources"]} for u, s in summaries.items()},
        }
    return {"allocation_requests": requests, "provider_summaries": summaries}


allocation_candidates.query_pattern = _SUFFIXED  # type: ignore[attr-defined]
allocation_candidates.query_regexes = _group_regexes  # type: ignore[attr-defined]


def _limit(values: list[str], version: Version) -> int | None:
    """``limit`` as Placement reads it: the first one given, a positive integer."""
    if not values:
        return None
    if not version.matches(*LIMIT_SINCE):
        raise queries.too_new("limit")
    if not values[0].isdigit() or int(values[0]) < 1:
        raise ValidationError(
            f"Invalid query string parameters: {values[0]!r} does not match '^[1-9][0-9]*$'. "
            "Failed validating 'pattern'",
            field="query.limit",
        )
    return int(values[0])


def _request_groups(
    lm: Loadmaster, request: Request, version: Version, subtrees: list[list[str]]
) -> tuple[list[RequestGroup], set[str]]:
    """The unnumbered group from ``resources``, ``required``, ``member_of``, ``in_tree``,
    and each numbered one from the same names with its suffix (1.25; any suffix from
    1.33, numbers before); and every trait their ``required`` names. A group without
    resources is refused in Placement's words, but from 1.36 a numbered one that
    ``same_subtree`` names (it then only places its provider in the subtree)."""
    params = request.query_params
    known = {rc.name for rc in lm.resource_classes.list()}
    suffixes: list[str] = []
    for key in params:
        match = _SUFFIXED.match(key)
        if match is None:
            continue  # the route's own parameters; no_unknown_query refused the rest
        suffix = match.group(2)
        if not version.matches(*GRANULAR_SINCE):
            raise queries.too_new(key)
        if not version.matches(*ANY_SUFFIX_SINCE) and not _NUMBERED.match(suffix):
            raise queries.unmatched(key, _group_regexes(version))
        if suffix not in suffixes:
            suffixes.append(suffix)
    groups = []
    named: set[str] = set()
    for suffix in ["", *sorted(suffixes)]:
        amounts = queries.resources(params.get(f"resources{suffix}"), version, known)
        traits = params.getlist(f"required{suffix}")
        aggregates = params.getlist(f"member_of{suffix}")
        tree = params.get(f"in_tree{suffix}")
        if not (amounts or traits or aggregates or tree is not None):
            continue
        if tree is not None:
            if not version.matches(*IN_TREE_CANDIDATES_SINCE):
                raise queries.too_new(f"in_tree{suffix}")
            try:
                tree = str(uuidlib.UUID(tree))
            except ValueError:
                raise ValidationError(
                    "Invalid query string parameters: Expected 'in_tree' parameter to be a "
                    f"format of uuid. Got: {tree}",
                    field=f"query.in_tree{suffix}",
                ) from None
        wanted = queries.required(traits, version, since=queries.REQUIRED_CANDIDATES_SINCE)
        conflicting = [w for w in (wanted.all_of, *wanted.any_of) if w and w <= wanted.none_of]
        if conflicting and version.matches(*queries.REQUIRED_FORBIDDEN_SINCE):
            raise ValidationError(
                "Conflicting required and forbidden traits found in the following traits "
                "keys: "
                + ", ".join(
                    sorted(f"required{suffix}: ({', '.join(sorted(c))})" for c in conflicting)
                ),
                field=f"query.required{suffix}",
            )
        named |= wanted.names()
        rule = queries.member_of(aggregates, version, since=MEMBER_OF_CANDIDATES_SINCE)
        groups.append(RequestGroup(suffix, amounts, wanted, rule, tree))
    _check_resourceless(groups, version, subtrees)
    return groups, named


def _check_resourceless(
    groups: list[RequestGroup], version: Version, subtrees: list[list[str]]
) -> None:
    """Placement's rules for groups without ``resources``, and for ``same_subtree``'s
    suffixes, in its words."""
    resourceless = [g for g in groups if not g.amounts]
    if version.matches(*SAME_SUBTREE_SINCE):
        if len(resourceless) == len(groups):
            raise MissingQueryValue(
                "There must be at least one resources or resources[$S] parameter.",
                field="query.resources",
            )
        in_subtrees = {n for names in subtrees for n in names}
        bad = [g.suffix for g in resourceless if g.suffix not in in_subtrees]
        if bad:
            raise BadQueryValue(
                "Resourceless suffixed group request should be specified in `same_subtree` "
                f"query param: bad group(s) - {bad}.",
                field="query.same_subtree",
            )
        suffixes = {g.suffix for g in groups}
        unknown = [n for names in subtrees for n in names if n not in suffixes]
        if unknown:
            raise BadQueryValue(
                f"Real suffixes should be specified in `same_subtree`: {unknown} not found "
                f"in {sorted(s for s in suffixes if s)}.",
                field="query.same_subtree",
            )
        return
    orphans = {
        "traits": [f"required{g.suffix}" for g in resourceless if g.required.names()],
        "member_of": [
            f"member_of{g.suffix}"
            for g in resourceless
            if g.member_of.any_of or g.member_of.none_of
        ],
    }
    for kind, keys in orphans.items():
        if keys:
            # Placement's two sentences, spaced as it spaces them.
            gap = "  " if kind == "traits" else " "
            raise ValidationError(
                f"All {kind} parameters must be associated with resources.{gap}Found the "
                f"following orphaned {kind} keys: {', '.join(keys)}",
                field=f"query.{keys[0]}",
            )
    if resourceless:
        raise ValidationError(
            "All request groups must specify resources.",
            field=f"query.resources{resourceless[0].suffix}",
        )
    if not groups and not version.matches(*GRANULAR_SINCE):
        raise ValidationError(
            "Invalid query string parameters: 'resources' is a required property",
            field="query.resources",
        )
    if not groups:
        raise ValidationError(
            "At least one request group (`resources` or `resources{$S}`) is required.",
            field="query.resources",
        )
