"""Properties of the two input guards every request passes (issue 13, defects 4 and 6)."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from loadmaster.api.errors import _nul_in
from loadmaster.cluster.lookup import canonical_uuid

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(min_codepoint=1)),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(alphabet=st.characters(min_codepoint=1), max_size=5), inner, max_size=4
        )
    ),
    max_leaves=12,
)


@given(st.uuids(), st.lists(st.booleans(), min_size=36, max_size=36), st.booleans())
def test_any_spelling_of_a_uuid_is_the_stored_one(
    value: uuidlib.UUID, upper: list[bool], braces: bool
) -> None:
    text = "".join(c.upper() if up else c for c, up in zip(str(value), upper, strict=True))
    if braces:
        text = "{" + text + "}"
    assert canonical_uuid(text) == str(value)


@given(st.text())
def test_what_is_not_a_uuid_is_left_alone(text: str) -> None:
    try:
        uuidlib.UUID(text)
    except ValueError:
        assert canonical_uuid(text) == text


def _plant(data: Any, path: list[int]) -> tuple[Any, bool]:
    """``data`` with a NUL put into the first string or key found along ``path``."""
    if isinstance(data, str):
        return data + "\x00", True
    if isinstance(data, list) and data:
        i = path[0] % len(data) if path else 0
        child, done = _plant(data[i], path[1:])
        return [*data[:i], child, *data[i + 1 :]], done
    if isinstance(data, dict) and data:
        key = sorted(data)[path[0] % len(data) if path else 0]
        child, done = _plant(data[key], path[1:])
        if done:
            return {**data, key: child}, True
        return {**{k: v for k, v in data.items() if k != key}, key + "\x00": data[key]}, True
    return data, False


@given(JSON, st.lists(st.integers(min_value=0, max_value=10), max_size=6))
def test_a_nul_anywhere_in_a_body_is_found(data: Any, path: list[int]) -> None:
    assert _nul_in(data, "") is None
    planted, done = _plant(data, path)
    if done:
        assert _nul_in(planted, "") is not None


@given(
    st.text(alphabet="0123456789abcdefABCDEF-{}", min_size=30, max_size=40) | st.uuids().map(str)
)
def test_the_quick_path_for_canonical_uuids_answers_as_parsing_does(text: str) -> None:
    try:
        parsed = str(uuidlib.UUID(text))
    except ValueError:
        parsed = text
    assert canonical_uuid(text) == parsed
