"""The OpenAPI 3.1 document of the key contract (``spec/openapi/idempotency.yaml``): it validates
with ``openapi-spec-validator`` and names every problem of ``spec/PROTOCOL.md`` §10 under the
response of its status, with ``Retry-After`` exactly where the table says so."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

import pytest

from conftest import REPO

yaml = pytest.importorskip("yaml")
validator = pytest.importorskip("openapi_spec_validator")

DOC = REPO / "spec" / "openapi" / "idempotency.yaml"
PROTOCOL = REPO / "spec" / "PROTOCOL.md"


def _problem_table() -> List[Tuple[str, int, bool]]:
    """(slug, status, retry_after) rows of PROTOCOL §10's table."""
    text = PROTOCOL.read_text()
    section = text[text.index("## 10. Problem responses"):]
    section = section[: section.index("\n## ", 1)]
    rows = []
    for m in re.finditer(r"^\| `([a-z-]+)` \| (\d{3}) \| ([^|]*)\|", section, re.M):
        rows.append((m.group(1), int(m.group(2)), m.group(3).strip() == "yes"))
    assert len(rows) >= 9, rows
    return rows


def _doc() -> Dict[str, Any]:
    loaded: Dict[str, Any] = yaml.safe_load(DOC.read_text())
    return loaded


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = _doc()
    assert doc["openapi"].startswith("3.1")
    validator.validate(doc)


def test_every_problem_of_the_protocol_is_documented_under_its_status() -> None:
    doc = _doc()
    example = doc["paths"]["/payments"]["post"]["responses"]
    responses = doc["components"]["responses"]
    for slug, status, retry_after in _problem_table():
        ref = example.get(str(status))
        assert ref is not None, f"{slug}: no {status} response in the example operation"
        name = ref["$ref"].rsplit("/", 1)[-1]
        response = responses[name]
        assert f"`{slug}`" in response["description"], f"{slug} not named in {name}"
        has_header = "Retry-After" in response.get("headers", {})
        assert has_header == retry_after, f"{slug}: Retry-After documented {has_header}"
        schema = response["content"]["application/problem+json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/Problem"}


def test_the_key_parameter_and_the_replay_header() -> None:
    doc = _doc()
    key = doc["components"]["parameters"]["IdempotencyKey"]
    assert (key["name"], key["in"], key["required"]) == ("Idempotency-Key", "header", True)
    replayed = doc["components"]["headers"]["IdempotentReplayed"]
    assert replayed["schema"]["enum"] == ["true"]
