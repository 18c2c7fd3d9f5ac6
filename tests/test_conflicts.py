"""One conflict policy: pin > priority > error naming both providers. Never import order."""

from __future__ import annotations

import itertools

from omni_core.conflicts import Offer, resolve
from omni_core.kinds import Kind


def offer(dist: str, priority: int = 0, name: str = "FLASH_ATTN", version: str = "1.0") -> Offer:
    return Offer(Kind.ATTENTION_BACKEND, name, priority, dist.removeprefix("omni-plugin-"), dist, version)


def test_single_provider_wins():
    result = resolve([offer("omni-plugin-a")], {})
    [(key, decision)] = result.decisions.items()
    assert key == (Kind.ATTENTION_BACKEND, "flash_attn") and decision.rule == "only provider"


def test_equal_priority_is_a_conflict_naming_both_distributions_and_versions():
    result = resolve([offer("omni-plugin-a", version="1.2"), offer("omni-plugin-b", version="3.4")], {})
    assert not result.decisions
    [conflict] = result.conflicts
    message = conflict.message()
    assert "omni-plugin-a 1.2" in message and "omni-plugin-b 3.4" in message
    assert "omni plugins pin attention_backend FLASH_ATTN" in message


def test_higher_priority_wins_regardless_of_order():
    offers = [offer("omni-plugin-a", 0), offer("omni-plugin-b", 10), offer("omni-plugin-c", 5)]
    winners = set()
    for perm in itertools.permutations(offers):
        decision = resolve(perm, {}).decisions[(Kind.ATTENTION_BACKEND, "flash_attn")]
        winners.add(decision.winner.distribution)
        assert [o.distribution for o in decision.shadowed] == ["omni-plugin-c", "omni-plugin-a"]
    assert winners == {"omni-plugin-b"}


def test_pin_beats_priority_and_names_are_case_insensitive():
    offers = [offer("omni-plugin-a", 0, name="flash_attn"), offer("omni-plugin-b", 10)]
    result = resolve(offers, {(Kind.ATTENTION_BACKEND, "flash_attn"): "omni-plugin-a"})
    decision = result.decisions[(Kind.ATTENTION_BACKEND, "flash_attn")]
    assert decision.winner.distribution == "omni-plugin-a" and "pinned" in decision.rule


def test_pin_to_an_absent_distribution_is_noted_not_silently_applied():
    result = resolve([offer("omni-plugin-a"), offer("omni-plugin-b")], {(Kind.ATTENTION_BACKEND, "flash_attn"): "gone"})
    assert result.conflicts and "names no installed provider" in result.notes[0]


def test_lower_priority_ties_below_a_clear_winner_are_not_conflicts():
    result = resolve([offer("omni-plugin-a", 5), offer("omni-plugin-b", 0), offer("omni-plugin-c", 0)], {})
    assert not result.conflicts
    assert result.decisions[(Kind.ATTENTION_BACKEND, "flash_attn")].winner.distribution == "omni-plugin-a"


def test_same_name_in_different_kinds_does_not_conflict():
    model = Offer(Kind.MODEL, "FLASH_ATTN", 0, "m", "omni-plugin-m", "1")
    result = resolve([offer("omni-plugin-a"), model], {})
    assert len(result.decisions) == 2 and not result.conflicts
