"""Schemathesis hooks for `scripts/schemathesis`.

They weaken no check. They keep a generated request from claiming what the API's document
does not say:

- `filter_case` drops a case that schemathesis labels positive ("valid data") although a
  header in it breaks that header's schema. Schemathesis 4.32's coverage phase narrows
  header values to `[A-Za-z0-9]` to keep them sendable; for a header whose pattern needs
  other characters (`If-Match: "3"`) it then sends a value such as `0` and still calls it
  valid, so `positive_data_acceptance` would fail on the tool's mislabel, not on the API.
- `filter_case` also drops a positive case whose order lines repeat a SKU. The document
  says "distinct SKUs" in words only (JSON Schema has no uniqueness by key; `uniqueItems`
  covers whole lines), and the API refuses a repeat with 422, as the document says.
- `before_call` keeps the `Idempotency-Key` of every positive case fresh, in every phase,
  stateful included (schemathesis suggests such a hook for values that must be unique). A
  key promises one request: the same key on a different request is refused with 422, as
  the document says, and generators repeat small values (`0`, `a`) across unrelated
  requests, which would turn that documented refusal into a `positive_data_acceptance`
  failure.
"""

import uuid

import jsonschema_rs
import schemathesis

IDEMPOTENCY_KEY = "idempotency-key"
# Arrays whose elements must differ in one field, by operation: (array, field).
DISTINCT_BY = {("POST", "/orders"): ("items", "sku")}
_seen_keys: set[str] = set()


def _is_positive(case) -> bool:
    return case.meta is not None and case.meta.generation.mode.is_positive


def _header(case, name: str) -> str | None:
    for key in case.headers or {}:
        if key.lower() == name:
            return key
    return None


def _headers_follow_their_schemas(case) -> bool:
    for parameter in case.operation.headers:
        key = _header(case, parameter.name.lower())
        schema = parameter.definition.get("schema")
        # The document's header schemas are inline (no `$ref`), so each stands alone.
        if key is None or not isinstance(schema, dict):
            continue
        if not jsonschema_rs.validator_for(schema).is_valid(case.headers[key]):
            return False
    return True


def _elements_are_distinct(case) -> bool:
    rule = DISTINCT_BY.get((case.operation.method.upper(), case.operation.path))
    if rule is None or not isinstance(case.body, dict):
        return True
    array, field = rule
    elements = case.body.get(array)
    if not isinstance(elements, list):
        return True
    values = [repr(element.get(field)) for element in elements if isinstance(element, dict)]
    return len(values) == len(set(values))


@schemathesis.hook
def filter_case(ctx, case) -> bool:
    if not _is_positive(case):
        return True
    return _headers_follow_their_schemas(case) and _elements_are_distinct(case)


def _key(value: str) -> str:
    """The key a header value carries: `"k"` and `k` are the same key, as the API reads them."""
    if len(value) > 2 and value.startswith('"') and value.endswith('"'):
        return value[1:-1]
    return value


@schemathesis.hook
def before_call(ctx, case, kwargs) -> None:
    name = _header(case, IDEMPOTENCY_KEY)
    if name is not None and _is_positive(case):
        if _key(case.headers[name]) in _seen_keys:
            case.headers[name] = str(uuid.uuid4())
        _seen_keys.add(_key(case.headers[name]))
