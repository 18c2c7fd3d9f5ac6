"""The one seeding rule of the speech runtime.

The engine (:class:`omni_core.speech.engine.SpeechEngine`) owns seeding: it draws the
request's seed when none is given, and seeds the platform it chose before synthesis. An
adapter that synthesises in segments (sentence by sentence, so it can stream) reseeds before
each one through its context, :meth:`omni_core.speech.adapter.AdapterContext.segments`, which
applies :func:`segment_seed` on the engine's platform. Every adapter therefore derives segment
seeds the same way, and ``stream()`` concatenates to exactly what ``generate()`` returns for
the same seed. No adapter calls ``torch.manual_seed`` itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from omni_core.platforms import Platform

T = TypeVar("T")

#: a large odd stride spreads the segments of nearby request seeds apart
SEGMENT_STRIDE = 1_000_003
#: seeds stay below 2**63, which every generator the platforms seed accepts
SEED_MODULUS = 2**63


def segment_seed(seed: int, index: int) -> int:
    """The seed of segment ``index`` of a request seeded with ``seed``; segment 0 gets the
    request's seed itself, so a one-segment utterance is seeded as the engine seeded it."""
    return (seed + SEGMENT_STRIDE * index) % SEED_MODULUS


def seeded_segments(platform: Platform | None, seed: int, segments: Iterable[T]) -> Iterator[T]:
    """Yield each of ``segments`` after seeding ``platform`` with :func:`segment_seed` for it.
    Seeding happens as each segment is taken, so the segment's synthesis (until the next one
    is asked for) runs on its own seed whether the caller streams or collects."""
    if platform is None:
        raise RuntimeError(
            "this adapter context has no platform to seed; adapters are run by SpeechEngine, which "
            "hands them its platform (build AdapterContext with platform=... to run one directly)"
        )
    for index, segment in enumerate(segments):
        platform.seed_everything(segment_seed(seed, index))
        yield segment
