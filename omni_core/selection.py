"""Selections that explain themselves: every candidate, why it lost, and who won."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Outcome(enum.StrEnum):
    SELECTED = "selected"
    REJECTED = "rejected"  # considered and ruled out, with the reason
    FAILED = "failed"  # the check itself raised: a problem to fix, not a silent fallback
    NOT_CONSIDERED = "not-considered"  # an earlier rule decided first

    def __str__(self) -> str:
        return self.value


_MARK = {Outcome.SELECTED: "*", Outcome.REJECTED: "-", Outcome.FAILED: "!", Outcome.NOT_CONSIDERED: " "}


@dataclass
class Candidate:
    name: str
    outcome: Outcome
    reason: str
    provider: str = ""


@dataclass
class Explanation:
    """The story of one selection, printable and JSON-serialisable."""

    subject: str
    candidates: list[Candidate] = field(default_factory=list)
    winner: str | None = None
    rule: str = ""

    def add(self, name: str, outcome: Outcome, reason: str, provider: str = "") -> None:
        self.candidates.append(Candidate(name, outcome, reason, provider))

    @property
    def failures(self) -> list[Candidate]:
        return [c for c in self.candidates if c.outcome is Outcome.FAILED]

    def render(self) -> str:
        lines = [f"{self.subject}:"]
        width = max((len(c.name) for c in self.candidates), default=4)
        for c in self.candidates:
            by = f"  [{c.provider}]" if c.provider else ""
            lines.append(f"  {_MARK[c.outcome]} {c.name:<{width}}  {c.outcome.value:<14} {c.reason}{by}")
        if self.winner:
            lines.append(f"  => {self.winner} ({self.rule})")
        else:
            lines.append(f"  => nothing selected ({self.rule})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "winner": self.winner,
            "rule": self.rule,
            "candidates": [
                {"name": c.name, "outcome": c.outcome.value, "reason": c.reason, "provider": c.provider}
                for c in self.candidates
            ],
        }
