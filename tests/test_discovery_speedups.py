"""The shortcuts that keep discovery flat as plugins grow must give the same answers as the
slow paths they replace."""

from __future__ import annotations

import json
import os
import time
from importlib import metadata

from omni_core.discovery import _name_version
from omni_core.manifest import ManifestCache

MANIFEST = 'omni_api = ">=1.0,<2"\n[[model]]\nname = "m"\nref = "pkg.m:M"\n'


def _age(path, seconds=60):
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_header_reader_agrees_with_the_metadata_parser_for_every_installed_distribution():
    checked = 0
    for dist in metadata.distributions():
        meta = dist.metadata
        if meta is None or meta["Name"] is None:
            continue
        assert _name_version(dist) == (meta["Name"], meta["Version"]), dist
        checked += 1
    assert checked > 10


def test_manifest_cache_remembers_settled_files_and_rereads_changed_ones(tmp_path, monkeypatch):
    import omni_core.manifest

    # files count as settled at once here, instead of two seconds after their last change
    monkeypatch.setattr(omni_core.manifest, "_SETTLE_NS", -1)
    manifest = tmp_path / "omni_plugin.toml"
    manifest.write_text(MANIFEST)
    _age(manifest)
    cache = ManifestCache(tmp_path / "cache")
    assert cache.read(manifest)["model"][0]["name"] == "m"
    cache.save()
    stored = json.loads((tmp_path / "cache" / "manifest-cache.json").read_text())
    assert str(manifest) in stored["manifests"]

    # a new process reads the remembered parse...
    assert ManifestCache(tmp_path / "cache").read(manifest)["model"][0]["ref"] == "pkg.m:M"
    # ...until the file changes, even to the same size with its old modification time
    manifest.write_text(MANIFEST.replace('"m"', '"n"'))
    _age(manifest)
    assert ManifestCache(tmp_path / "cache").read(manifest)["model"][0]["name"] == "n"


def test_freshly_written_manifests_are_not_cached_and_a_broken_cache_is_ignored(tmp_path):
    manifest = tmp_path / "omni_plugin.toml"
    manifest.write_text(MANIFEST)  # just written: its timestamps may not have settled yet
    cache = ManifestCache(tmp_path / "cache")
    cache.read(manifest)
    cache.save()
    assert not (tmp_path / "cache" / "manifest-cache.json").exists()
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "manifest-cache.json").write_text("{not json")
    assert ManifestCache(tmp_path / "cache").read(manifest)["omni_api"] == ">=1.0,<2"
