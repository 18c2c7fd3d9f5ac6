"""Manifests are validated field by field, with messages that name the field and the fix."""

from __future__ import annotations

import pytest

from omni_core.errors import ManifestError
from omni_core.kinds import Kind
from omni_core.manifest import parse_manifest

GOOD = {
    "omni_api": ">=1.0,<2",
    "description": "demo",
    "platform": [{"name": "cpu", "ref": "pkg.platform:Cpu", "probe": "pkg.platform:probe", "priority": -100}],
    "model": [{"name": "echo", "ref": "pkg.model:Echo", "architectures": ["EchoPipeline"]}],
}


def test_parses_declared_extensions_with_kind_specific_fields():
    manifest = parse_manifest(GOOD)
    assert manifest.omni_api == ">=1.0,<2"
    assert [(d.kind, d.name) for d in manifest.provides] == [(Kind.PLATFORM, "cpu"), (Kind.MODEL, "echo")]
    platform = manifest.of_kind(Kind.PLATFORM)[0]
    assert platform.priority == -100 and platform.fields == {"probe": "pkg.platform:probe"}
    assert manifest.of_kind(Kind.MODEL)[0].fields == {"architectures": ["EchoPipeline"]}
    assert manifest.kinds == [Kind.PLATFORM, Kind.MODEL]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("omni_api"), 'missing "omni_api"'),
        (lambda d: d.update(colour="red"), "unknown key"),
        (lambda d: d.update(platform={"name": "x"}), "array of tables"),
        (lambda d: d["model"][0].pop("ref"), "needs ref"),
        (lambda d: d["model"][0].update(ref="no_colon"), "invalid reference"),
        (lambda d: d["model"][0].update(priority="high"), "priority must be an integer"),
        (lambda d: d["model"].append(dict(d["model"][0], name="ECHO")), "declared twice"),
        (lambda d: d["model"][0].update(name=""), "without a name"),
        (lambda d: d.update(requires_hardware="cuda"), "requires_hardware"),
    ],
)
def test_malformed_manifests_name_the_problem(mutate, message):
    data = {k: (list(map(dict, v)) if isinstance(v, list) else v) for k, v in GOOD.items()}
    mutate(data)
    with pytest.raises(ManifestError, match=message):
        parse_manifest(data, "demo.toml")
