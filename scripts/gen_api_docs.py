"""Write docs/api.md, the HTTP API reference, from the server's own OpenAPI schema.

    python scripts/gen_api_docs.py           # (re)write docs/api.md
    python scripts/gen_api_docs.py --check   # exit 1 when docs/api.md is not what this writes

The schema is ``create_app(config).openapi()`` for a server of one placeholder model: routes
and bodies do not depend on the models served, and building the app loads none. So every
route, field, type, default, rule and description on the page is the one the server checks
and serves at ``GET /openapi.json``; a change there shows up here, and the page cannot drift
(``tests/test_docs_api.py`` fails until this script is run again).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "api.md"
SCRIPT = "scripts/gen_api_docs.py"
METHODS = ("get", "post", "put", "patch", "delete")


def schema() -> dict[str, Any]:
    """The OpenAPI schema of a server of one placeholder model (nothing is loaded)."""
    from omni_core.server import ModelSource, ServerConfig
    from omni_core.server.app import create_app

    config = ServerConfig(models=(ModelSource(name="model", path=Path("model")),))
    return create_app(config).openapi()


def error_types() -> dict[int, str]:
    """The ``error.type`` each status answers with (the app's own table)."""
    from omni_core.server.app import ERROR_TYPES

    return dict(ERROR_TYPES)


# -- JSON schema to words -----------------------------------------------------------------------


def _anchor(name: str) -> str:
    return name.lower()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _literal(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def type_of(prop: dict[str, Any]) -> str:
    """A property's type in words: ``string or null``, ``one of "a", "b"``, a link to an object."""
    if "$ref" in prop:
        name = _ref_name(prop["$ref"])
        return f"[`{name}`](#{_anchor(name)})"
    if "anyOf" in prop:
        parts = [type_of(p) for p in prop["anyOf"]]
        return " or ".join(dict.fromkeys(parts))
    if "const" in prop:
        return _literal(prop["const"])
    if "enum" in prop:
        return "one of " + ", ".join(_literal(v) for v in prop["enum"])
    kind = prop.get("type")
    if kind == "array":
        return f"array of {type_of(prop.get('items', {}))}"
    if kind == "object":
        extra = prop.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"object of {type_of(extra)}"
        return "object"
    if kind is None:
        return "any"
    return str(kind)


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _rules(prop: dict[str, Any]) -> list[str]:
    rules = []
    if "minimum" in prop and "maximum" in prop:
        rules.append(f"{_number(prop['minimum'])} to {_number(prop['maximum'])}")
    elif "minimum" in prop:
        rules.append(f"at least {_number(prop['minimum'])}")
    elif "maximum" in prop:
        rules.append(f"at most {_number(prop['maximum'])}")
    if "exclusiveMinimum" in prop:
        rules.append(f"above {_number(prop['exclusiveMinimum'])}")
    if "exclusiveMaximum" in prop:
        rules.append(f"below {_number(prop['exclusiveMaximum'])}")
    if "minLength" in prop and "maxLength" in prop:
        rules.append(f"{prop['minLength']} to {prop['maxLength']} characters")
    elif "minLength" in prop:
        rules.append(f"at least {prop['minLength']} character{'s' if prop['minLength'] != 1 else ''}")
    elif "maxLength" in prop:
        rules.append(f"at most {prop['maxLength']} characters")
    if "pattern" in prop:
        rules.append(f"matches `{prop['pattern']}`")
    if "minItems" in prop:
        rules.append(f"at least {prop['minItems']} items")
    if "maxItems" in prop:
        rules.append(f"at most {prop['maxItems']} items")
    return rules


def constraints(prop: dict[str, Any]) -> str:
    """The rules a value must meet, from the property and (for ``X or null``) its branches."""
    rules = _rules(prop)
    for branch in prop.get("anyOf", []):
        rules += _rules(branch)
    return "; ".join(dict.fromkeys(rules))


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("|", "\\|")).strip() or "—"


def _default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in prop or prop["default"] is None:
        return "—"
    return _literal(prop["default"])


def fields_table(obj: dict[str, Any], *, request: bool) -> list[str]:
    """One row per property. A request body's: name, type, default, rules, description (the
    required fields first); an answer's: name, type, description (an answer has every field,
    null where its type allows)."""
    required = set(obj.get("required", []))
    props = obj.get("properties", {})
    if request:
        names = [n for n in props if n in required] + [n for n in props if n not in required]
        rows = ["| field | type | default | rules | description |", "|---|---|---|---|---|"]
    else:
        names = list(props)
        rows = ["| field | type | description |", "|---|---|---|"]
    for name in names:
        prop = props[name]
        description = _cell(prop.get("description", ""))
        if request:
            row = [f"`{name}`", type_of(prop), _default(prop, name in required), _cell(constraints(prop)), description]
        else:
            row = [f"`{name}`", type_of(prop), description]
        rows.append("| " + " | ".join(row) + " |")
    if obj.get("additionalProperties") is False and request:
        rows += ["", "Any other field is refused (400, naming it and the fields accepted)."]
    return rows


# -- the page -------------------------------------------------------------------------------------


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, ops in spec.get("paths", {}).items()
        for method, op in ops.items()
        if method in METHODS
    ]


def _is_error(status: str) -> bool:
    return status.isdigit() and int(status) >= 400


def _error_set(op: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (status, r.get("description", "")) for status, r in op.get("responses", {}).items() if _is_error(status)
    )


def _content(response: dict[str, Any]) -> str:
    content = response.get("content") or {}
    parts = []
    for media, body in content.items():
        ref = (body.get("schema") or {}).get("$ref")
        parts.append(f"`{media}`" + (f": [`{_ref_name(ref)}`](#{_anchor(_ref_name(ref))})" if ref else ""))
    return ", ".join(parts) or "—"


def _request_schemas(op: dict[str, Any]) -> list[tuple[list[str], str]]:
    """(media types, body object name) of an operation's request body, media types sharing a body together."""
    content = (op.get("requestBody") or {}).get("content") or {}
    by_body: dict[str, list[str]] = {}
    for media, body in content.items():
        ref = (body.get("schema") or {}).get("$ref", "")
        by_body.setdefault(_ref_name(ref), []).append(media)
    return [(media, name) for name, media in by_body.items()]


def render(spec: dict[str, Any], types: dict[int, str]) -> str:
    info = spec.get("info", {})
    components = spec.get("components", {}).get("schemas", {})
    operations = _operations(spec)
    # the errors most routes share are described once, under Errors
    common = Counter(_error_set(op) for _, _, op in operations if _error_set(op)).most_common(1)
    shared = dict(common[0][0]) if common else {}

    out = [
        "# HTTP API",
        "",
        f"<!-- generated by {SCRIPT} from the server's OpenAPI schema: edit the server, then run `python {SCRIPT}` -->",
        "",
    ]
    intro = " ".join(x for x in (info.get("summary", ""), info.get("description", "")) if x)
    if intro:
        out += [intro, ""]
    out += [
        "This page is generated from the schema the server itself serves at `GET /openapi.json`, "
        "so it lists exactly the routes, fields and rules a running server checks. How to run the "
        "server, its limits and its operation: [Serving](serving.md).",
        "",
        "## Routes",
        "",
        "| method | path | summary |",
        "|---|---|---|",
    ]
    for method, path, op in operations:
        anchor = _anchor(f"{method} {path}".replace("/", "").replace("{", "").replace("}", "").replace(" ", "-"))
        out.append(f"| `{method.upper()}` | [`{path}`](#{anchor}) | {_cell(op.get('summary', ''))} |")
    out += ["", "## Errors", ""]
    error_model = components.get("ErrorResponse", {})
    if error_model.get("description"):
        out += [error_model["description"], ""]
    out += [
        "Every error answers with the same JSON body, whatever the route and the status:",
        "",
        "```json",
        '{"error": {"message": "...", "type": "...", "param": "...", "code": "..."}}',
        "```",
        "",
    ]
    detail = components.get("ErrorDetail")
    if detail:
        out += [*fields_table(detail, request=False), ""]
    if shared:
        out += ["| status | `error.type` | when |", "|---|---|---|"]
        for status, description in sorted(shared.items()):
            out.append(f"| {status} | `{types.get(int(status), 'server_error')}` | {_cell(description)} |")
        out.append("")

    for method, path, op in operations:
        out += [f"## {method.upper()} {path}", ""]
        if op.get("summary"):
            out += [f"**{op['summary']}.**", ""]
        if op.get("description"):
            out += [op["description"].strip(), ""]
        params = op.get("parameters") or []
        if params:
            out += ["| parameter | in | type | description |", "|---|---|---|---|"]
            for p in params:
                where = p.get("in", "")
                desc = _cell(p.get("description", ""))
                out.append(f"| `{p['name']}` | {where} | {type_of(p.get('schema', {}))} | {desc} |")
            out.append("")
        for media, name in _request_schemas(op):
            body = components.get(name, {})
            kinds = " or ".join(f"`{m}`" for m in media)
            out += [f"Request body ({kinds}), `{name}`:", ""]
            if body.get("description"):
                out += [body["description"].strip(), ""]
            out += [*fields_table(body, request=True), ""]
        responses = op.get("responses", {})
        own = [(s, r) for s, r in responses.items() if not _is_error(s) or shared.get(s) != r.get("description")]
        out += ["| status | body | description |", "|---|---|---|"]
        for status, response in own:
            out.append(f"| {status} | {_content(response)} | {_cell(response.get('description', ''))} |")
        out.append("")
        rest = [s for s in responses if _is_error(s) and shared.get(s) == responses[s].get("description")]
        if rest:
            out += [f"Errors: {', '.join(rest)}, as described under [Errors](#errors).", ""]

    # the answers' objects (request bodies are under their route, the error shape under Errors)
    request_bodies = {name for _, _, op in operations for _, name in _request_schemas(op)}
    objects = [n for n in components if n not in request_bodies | {"ErrorResponse", "ErrorDetail"}]
    if objects:
        out += ["## Objects", "", "What the routes answer with, field by field.", ""]
        for name in objects:
            obj = components[name]
            out += [f"### {name}", ""]
            if obj.get("description"):
                out += [obj["description"].strip(), ""]
            out += [*fields_table(obj, request=False), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/api.md is stale; write nothing")
    args = parser.parse_args(argv)
    text = render(schema(), error_types())
    current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else ""
    if args.check:
        if current != text:
            print(f"docs/api.md is stale: run `python {SCRIPT}`", file=sys.stderr)
            return 1
        print("docs/api.md is up to date")
        return 0
    if current != text:
        PAGE.write_text(text, encoding="utf-8")
        print("wrote docs/api.md")
    else:
        print("docs/api.md is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
