"""Fault injection by rule: which request fails, and how.

A rule names an operation (or ``"*"`` for any), a kind of fault, and which of
the matching requests it hits: counting matching requests from the moment the
rule is added, it fires on request number ``nth`` (default 1) and on the
``count - 1`` after it (``count=None``: every one from ``nth`` on). ``match``
narrows the rule to object names (or list prefixes, upload ids...) containing
that substring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchbucket._opclass import OP_CLASS
from torchbucket.errors import ConfigError

__all__ = [
    "FAULT_KINDS",
    "OPERATIONS",
    "STATUS_KINDS",
    "FaultRule",
    "FaultTable",
    "flip_byte",
]

#: A kind that is a number is an error answer with that HTTP status (GCS's JSON
#: or XML error document, as the route speaks): 501 says "no such API here".
STATUS_KINDS = frozenset({"403", "404", "405", "408", "429", "500", "501", "502", "503", "504"})

#: The kinds of fault a rule can inject. ``"corrupt"`` flips a byte of the
#: answer's body; ``"corrupt_request"`` flips a byte of the request's body before
#: the store sees it (damage in transit on the way up, which a checksum the
#: client declares lets the store refuse); a request without a body passes.
#: ``"stall"`` holds a request before the store sees it; ``"stall_answer"``
#: lets the store apply it and then holds the answer (the write is visible
#: to others meanwhile); both then close the connection unanswered.
#: ``"stall_apply"`` holds a request before the store sees it, then applies it
#: and answers as usual, even if the client has gone (the latency model's
#: stall before a request is applied, on demand).
FAULT_KINDS = STATUS_KINDS | {
    "reset",
    "truncate",
    "corrupt",
    "corrupt_request",
    "stall",
    "stall_answer",
    "stall_apply",
}

#: Operation names, as rules, counters and the latency model use them.
OPERATIONS = frozenset(OP_CLASS)

#: Default length of a "stall", seconds: longer than a client's timeout in a
#: test, short enough that the server ends the connection by itself.
DEFAULT_STALL_SECONDS = 30.0


@dataclass(kw_only=True, slots=True)
class FaultRule:
    """One fault rule.

    Attributes:
        op: Operation name from :data:`OPERATIONS`, or ``"*"`` for any.
        kind: Fault kind from :data:`FAULT_KINDS`.
        nth: 1-based index of the first matching request that fails. Default 1.
        count: How many consecutive matching requests fail from ``nth`` on, or
            ``None`` for all of them. Default 1.
        match: Only requests whose object name (or list prefix) contains this
            substring match. Default ``None``: any.
        stall_seconds: For the ``"stall*"`` kinds: how long the server
            holds the request (or its answer); ``"stall"`` and
            ``"stall_answer"`` then close the connection without an answer.
            Default 30.
        id: Assigned by the table.
        seen: Matching requests counted so far.
        fired: Times the rule fired so far.
    """

    op: str
    kind: str
    nth: int = 1
    count: int | None = 1
    match: str | None = None
    stall_seconds: float = DEFAULT_STALL_SECONDS
    id: int = 0
    seen: int = field(default=0)
    fired: int = field(default=0)

    def __post_init__(self) -> None:
        if self.op != "*" and self.op not in OPERATIONS:
            raise ConfigError(f"unknown fault op {self.op!r}; known: {sorted(OPERATIONS)} or '*'")
        if self.kind not in FAULT_KINDS:
            raise ConfigError(f"unknown fault kind {self.kind!r}; known: {sorted(FAULT_KINDS)}")
        if self.nth < 1:
            raise ConfigError(f"fault nth must be >= 1, got {self.nth!r}")
        if self.count is not None and self.count < 1:
            raise ConfigError(f"fault count must be >= 1 or None, got {self.count!r}")
        if self.stall_seconds < 0:
            raise ConfigError(f"stall_seconds must be >= 0, got {self.stall_seconds!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultRule:
        """Build a rule from the admin API's JSON form."""
        known = {"op", "kind", "nth", "count", "match", "stall_seconds"}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown fault rule fields {sorted(unknown)}")
        args = dict(data)
        if args.get("nth") is None:
            args.pop("nth", None)
        args["kind"] = str(args.get("kind", ""))
        return cls(**args)

    def to_dict(self) -> dict[str, Any]:
        """The rule as JSON-able fields."""
        return {
            "id": self.id,
            "op": self.op,
            "kind": self.kind,
            "nth": self.nth,
            "count": self.count,
            "match": self.match,
            "stall_seconds": self.stall_seconds,
            "seen": self.seen,
            "fired": self.fired,
        }


class FaultTable:
    """The active rules, consulted once per request."""

    __slots__ = ("_next_id", "rules")

    def __init__(self) -> None:
        self.rules: list[FaultRule] = []
        self._next_id = 1

    def add(self, rule: FaultRule) -> int:
        """Activate ``rule`` and return its id."""
        rule.id = self._next_id
        self._next_id += 1
        self.rules.append(rule)
        return rule.id

    def clear(self) -> None:
        """Remove every rule."""
        self.rules.clear()

    def check(self, op: str, name: str) -> FaultRule | None:
        """Count this request against every matching rule; return the one that fires.

        Every matching rule counts the request, so ``nth`` means the same thing
        whatever other rules exist; the first rule (oldest) that fires wins.

        Args:
            op: The request's operation.
            name: The object name, prefix or upload id the request is about.

        Returns:
            The rule to apply, or ``None``.
        """
        if not self.rules:
            return None
        hit: FaultRule | None = None
        for rule in self.rules:
            if rule.op != "*" and rule.op != op:
                continue
            if rule.match is not None and rule.match not in name:
                continue
            rule.seen += 1
            if rule.seen < rule.nth:
                continue
            if rule.count is not None and rule.seen >= rule.nth + rule.count:
                continue
            if hit is None:
                hit = rule
                rule.fired += 1
        return hit


def flip_byte(body: bytes) -> bytes:
    """``body`` with its middle byte inverted (an empty body stays empty).

    Inverting makes any ASCII byte a non-ASCII one, so a JSON or XML document
    hit this way no longer parses, and media bytes change.
    """
    if not body:
        return body
    flipped = bytearray(body)
    flipped[len(flipped) // 2] ^= 0xFF
    return bytes(flipped)
