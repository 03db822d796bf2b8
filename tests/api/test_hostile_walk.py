"""Every route of the OpenAPI document, walked with hostile strings in every path segment,
query value and body string, on both databases (issue 13): NUL characters, very long
text, unicode, upper-case uuids. Every answer is 2xx or 4xx, and a 4xx changed nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from api_helpers import table_rows as dump
from fastapi.testclient import TestClient

import loadmaster
from loadmaster.api import AuthConfig, create_app
from loadmaster.microversions import CLIENT_HEADERS
from loadmaster.service import Loadmaster

TOKEN = "walk-admin-token"
VM_UUID = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
HOSTILE = [
    "a\x00b",  # PostgreSQL cannot store it; it used to answer 500
    "x" * 5000,  # longer than any column
    "ünï¢ødé ☃ \u202e\U0001f600",  # unicode, a right-to-left override, an emoji
    VM_UUID.upper(),  # a uuid in upper case: the same VM
    "../../etc/passwd",
    "%00",
    " ",
]


@pytest.fixture
def walker(db_url: str) -> Iterator[tuple[TestClient, Loadmaster]]:
    lm = loadmaster.open(db_url)
    lm.hosts.create("0", inventories={"VCPU": {"total": 8}, "MEMORY_MB": {"total": 8192}})
    lm.flavors.create({"name": "0", "resources": {"VCPU": 1, "MEMORY_MB": 512}})
    lm.groups.create("0", "anti-affinity")
    lm.vms.create("0", "0", uuid=VM_UUID)
    app = create_app(lm, AuthConfig({TOKEN: "admin"}))
    with TestClient(
        app,
        raise_server_exceptions=False,
        headers={**CLIENT_HEADERS, "Authorization": f"Bearer {TOKEN}"},
    ) as client:
        yield client, lm
    lm.close()


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _sample(doc: dict[str, Any], schema: dict[str, Any], word: str, depth: int = 0) -> Any:
    """A value of the schema's shape with ``word`` in every string (and every key)."""
    schema = _resolve(doc, schema)
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        real = [o for o in options if _resolve(doc, o).get("type") != "null"]
        return _sample(doc, real[0], word, depth) if real else None
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        value = {
            name: _sample(doc, prop, word, depth + 1)
            for name, prop in schema.get("properties", {}).items()
        }
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and depth < 3:
            value[word] = _sample(doc, extra, word, depth + 1)
        return value
    if kind == "array":
        return [_sample(doc, schema.get("items", {}), word, depth + 1)] if depth < 3 else []
    if kind == "integer":
        return 1
    if kind == "number":
        return 0.5
    if kind == "boolean":
        return False
    return word


def _requests(doc: dict[str, Any], word: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in sorted(doc["paths"].items()):
        for method, operation in sorted(operations.items()):
            url = re.sub(r"\{[^}]+\}", lambda _m: _quote(word), path)
            query = {p["name"]: word for p in operation.get("parameters", []) if p["in"] == "query"}
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            kwargs: dict[str, Any] = {"params": query}
            if body is not None:
                kwargs["json"] = _sample(doc, body["schema"], word)
            yield method.upper(), url, kwargs
            if query:  # the path alone, without the hostile query
                yield method.upper(), url, {k: v for k, v in kwargs.items() if k != "params"}


def _targeted(word: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Bodies valid but for one hostile field, so that it reaches the domain and the store
    (a body hostile everywhere is refused by its first field)."""
    return [
        ("POST", "/resource_providers", {"json": {"name": word}}),
        ("POST", "/hosts", {"json": {"name": "p", "aggregates": [word]}}),
        ("POST", "/vms", {"json": {"name": word, "flavor": "0"}}),
        ("POST", "/vms", {"json": {"name": "v", "flavor": "0", "project_id": word}}),
        ("POST", "/vms", {"json": {"name": "v", "flavor": "0", "tags": [word]}}),
        ("POST", "/flavors", {"json": {"name": word, "resources": {"VCPU": 1}}}),
        ("POST", "/server_groups", {"json": {"name": word, "policy": "affinity"}}),
        ("POST", "/hosts/0/report", {"json": {"running_vms": [word]}}),
        ("GET", "/vms", {"params": {"project_id": word}}),
    ]


def _quote(word: str) -> str:
    from urllib.parse import quote

    return quote(word, safe="")


def test_every_route_survives_hostile_strings(walker: tuple[TestClient, Loadmaster]) -> None:
    client, lm = walker
    doc = client.get("/openapi.json").json()
    failures: list[str] = []
    seen = 0
    for word in HOSTILE:
        for method, url, kwargs in [*_requests(doc, word), *_targeted(word)]:
            before = dump(lm)
            response = client.request(method, url, **kwargs)
            seen += 1
            where = f"{method} {url[:80]} {word[:20]!r}: {response.status_code}"
            if response.status_code >= 500:
                failures.append(f"{where} {response.text[:200]}")
            elif response.status_code >= 400:
                if dump(lm) != before:
                    failures.append(f"{where} refused but changed the database")
                body = response.json()
                assert {"code", "title", "detail"} <= set(body), where
            if "\x00" in word and response.status_code < 400 and method != "GET":
                failures.append(f"{where} took a NUL character")
    assert seen > 300
    assert failures == []
