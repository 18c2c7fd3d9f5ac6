from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["omni_core.testing"]


@pytest.fixture(scope="session")
def speecht5_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight SpeechT5 checkpoint (made once per session, in a temp dir)."""
    from omni_plugin_speecht5.adapter import SpeechT5Adapter

    return SpeechT5Adapter.make_tiny(tmp_path_factory.mktemp("speecht5-tiny"), seed=0)


@pytest.fixture(scope="session")
def speecht5_engine(speecht5_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real speech runtime on the tiny checkpoint: installed plugins, real detection, the
    selected platform. The environment is private (config and cache dirs, no OMNI_* filters)."""
    import torch

    from omni_core.platforms import select_platform
    from omni_core.plugins import load_plugins
    from omni_core.speech.engine import SpeechEngine
    from omni_core.testing.fixtures import FILTER_VARIABLES

    home = tmp_path_factory.mktemp("omni-home")
    threads = torch.get_num_threads()
    # The tiny model's tensors are a few dozen floats: on a shared machine a multi-threaded
    # pool costs ~20x per decoder step in synchronisation alone.
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        for name in FILTER_VARIABLES:
            mp.delenv(name, raising=False)
        mp.setenv("OMNI_CONFIG_DIR", str(home / "config"))
        mp.setenv("OMNI_CACHE_DIR", str(home / "cache"))
        plugins = load_plugins()
        platform = select_platform(plugins).instantiate()
        yield SpeechEngine(speecht5_tiny, plugins=plugins, platform=platform)
    torch.set_num_threads(threads)
