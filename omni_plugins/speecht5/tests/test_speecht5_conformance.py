from omni_core.manifest import read_manifest
from omni_core.testing import PluginConformance


class TestSpeechT5Conformance(PluginConformance):
    plugin_name = "speecht5"


def test_speecht5_class_attributes_match_the_manifest() -> None:
    """Detection reads the registration; the adapter class must say the same about itself."""
    from omni_plugin_speecht5.adapter import SpeechT5Adapter

    (declared,) = read_manifest("omni_plugin_speecht5.hooks").provides
    assert declared.ref == "omni_plugin_speecht5.adapter:SpeechT5Adapter"
    assert declared.name == SpeechT5Adapter.name == "speecht5"
    assert frozenset(declared.fields["stage_keys"]) == SpeechT5Adapter.stage_keys == {"speecht5"}
    assert frozenset(declared.fields["model_archs"]) == SpeechT5Adapter.model_archs == {"SpeechT5ForTextToSpeech"}
    assert declared.fields["detect_priority"] == SpeechT5Adapter.detect_priority
    assert SpeechT5Adapter.backend == "ar"


def test_speecht5_matches_by_arch_before_stage_key() -> None:
    from omni_plugin_speecht5.adapter import SpeechT5Adapter

    assert SpeechT5Adapter.matches(None, "SpeechT5ForTextToSpeech")
    assert SpeechT5Adapter.matches("speecht5", None)
    assert SpeechT5Adapter.matches("speecht5", "SpeechT5ForTextToSpeech")
    # an architecture match is authoritative: a shared stage key does not claim another arch
    assert not SpeechT5Adapter.matches("speecht5", "VitsModel")
    assert not SpeechT5Adapter.matches(None, "SpeechT5ForSpeechToText")
    assert not SpeechT5Adapter.matches(None, None)
