"""Request-level fault injection (admin codes 9000-9004), sans-IO.

A fault matches requests by code, optionally only those of one group and/or client id, and answers
them with a sequence of errors, delays them, or drops their responses. It applies to ``count`` requests
or for ``durationMs`` (whichever ends first); with neither, to ``len(errors)`` requests when errors are
given, else until cleared. Durations come from the request and are not time-scaled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rmqlab.protocol.codes import ADMIN_CODE_RANGE
from rmqlab.protocol.command import (
    InvalidParameter,
    field_bool,
    field_int,
    field_int32,
    field_list,
    field_str,
)

# Bounds of one fault and of the table (README "Limits"): a fault is a test tool, not a way to stall a
# broker for ever or to fill its memory.
MAX_FAULTS = 1000
MAX_FAULT_ERRORS = 100
MAX_FAULT_LATENCY_MS = 120_000  # RocketMQ's longest client-visible interval (channel expiry)
MAX_FAULT_COUNT = 1_000_000
MAX_FAULT_DURATION_MS = 24 * 3600 * 1000
MAX_FAULT_REMARK = 1024


@dataclass(frozen=True, slots=True)
class FaultError:
    """An error response a fault answers with."""

    code: int
    remark: str

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "remark": self.remark}


@dataclass(slots=True)
class Fault:
    """An injected fault: which requests it matches and what it does to them."""

    fault_id: int
    request_code: int
    group: str | None = None
    client_id: str | None = None
    errors: list[FaultError] = field(default_factory=list)
    latency_ms: int = 0
    drop: bool = False
    count: int | None = None
    duration_ms: int | None = None
    created_ms: int = 0  # monotonic
    applied: int = 0

    @property
    def limit(self) -> int | None:
        if self.count is not None:
            return self.count
        if self.duration_ms is None and self.errors:
            return len(self.errors)
        return None

    def exhausted(self, now_ms: int) -> bool:
        limit = self.limit
        if limit is not None and self.applied >= limit:
            return True
        return self.duration_ms is not None and now_ms - self.created_ms >= self.duration_ms

    def matches(self, code: int, group: str | None, client_id: str | None) -> bool:
        if code != self.request_code:
            return False
        if self.group is not None and group != self.group:
            return False
        return self.client_id is None or client_id == self.client_id

    def to_wire(self, now_ms: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "faultId": self.fault_id,
            "requestCode": self.request_code,
            "group": self.group,
            "clientId": self.client_id,
            "errors": [e.to_wire() for e in self.errors],
            "latencyMs": self.latency_ms,
            "drop": self.drop,
            "count": self.count,
            "durationMs": self.duration_ms,
            "applied": self.applied,
        }
        if now_ms is not None and self.duration_ms is not None:
            d["remainingMs"] = max(0, self.created_ms + self.duration_ms - now_ms)
        return d


@dataclass(frozen=True, slots=True)
class FaultAction:
    """What a matching fault does to one request: an error, a delay or a dropped answer."""

    fault_id: int
    error: FaultError | None
    latency_ms: int
    drop: bool


def parse_fault_spec(body: Any) -> dict[str, Any]:
    """Validate an ADMIN_FAULT_ADD body; raises InvalidParameter naming the field."""
    if not isinstance(body, dict):
        raise InvalidParameter("body", "expected a map" if body is not None else "missing")
    code = field_int32(body, "requestCode", "body")
    if code in ADMIN_CODE_RANGE:
        raise InvalidParameter("body.requestCode", "admin codes cannot be faulted")
    errors: list[FaultError] = []
    raw_errors = field_list(body, "errors", "body", [])
    if len(raw_errors) > MAX_FAULT_ERRORS:
        raise InvalidParameter("body.errors", f"{len(raw_errors)} errors, at most {MAX_FAULT_ERRORS}")
    for i, e in enumerate(raw_errors):
        where = f"body.errors[{i}]"
        if not isinstance(e, dict):
            raise InvalidParameter(where, "expected a map")
        remark = field_str(e, "remark", where, "injected fault")
        if len(remark) > MAX_FAULT_REMARK:
            raise InvalidParameter(f"{where}.remark", f"longer than {MAX_FAULT_REMARK} characters")
        errors.append(FaultError(field_int32(e, "code", where), remark))
    latency = _bounded(body, "latencyMs", 0, MAX_FAULT_LATENCY_MS, 0)
    drop = field_bool(body, "drop", "body", False)
    count = _bounded(body, "count", 1, MAX_FAULT_COUNT, None)
    duration = _bounded(body, "durationMs", 1, MAX_FAULT_DURATION_MS, None)
    if not errors and latency == 0 and not drop:
        raise InvalidParameter("body", "a fault needs errors, latencyMs or drop")
    return {
        "request_code": code,
        "group": field_str(body, "group", "body", None),
        "client_id": field_str(body, "clientId", "body", None),
        "errors": errors,
        "latency_ms": latency,
        "drop": drop,
        "count": count,
        "duration_ms": duration,
    }


def _bounded(body: dict[str, Any], name: str, low: int, high: int, default: int | None) -> Any:
    value = field_int(body, name, "body", default)
    if value is not None and not low <= value <= high:
        raise InvalidParameter(f"body.{name}", f"must be in {low}..{high}, got {value}")
    return value


class FaultTable:
    """The broker's active faults; for each request the oldest matching one applies."""

    def __init__(self) -> None:
        self.faults: dict[int, Fault] = {}
        self._next_id = 1
        self.codes: set[int] = set()  # request codes with at least one fault: the dispatch fast path

    def __len__(self) -> int:
        return len(self.faults)

    def add(self, spec: dict[str, Any], now_ms: int) -> Fault:
        if len(self.faults) >= MAX_FAULTS:
            self.sweep(now_ms)
            if len(self.faults) >= MAX_FAULTS:
                raise InvalidParameter("body", f"the fault table is full ({MAX_FAULTS} faults); clear some")
        fault = Fault(self._next_id, created_ms=now_ms, **spec)
        self._next_id += 1
        self.faults[fault.fault_id] = fault
        self._recount()
        return fault

    def clear(self, fault_id: int | None = None) -> list[Fault]:
        if fault_id is None:
            removed = list(self.faults.values())
            self.faults.clear()
        else:
            f = self.faults.pop(fault_id, None)
            removed = [f] if f is not None else []
        self._recount()
        return removed

    def sweep(self, now_ms: int) -> list[Fault]:
        """Remove faults that are used up or past their duration."""
        done = [f for f in self.faults.values() if f.exhausted(now_ms)]
        for f in done:
            del self.faults[f.fault_id]
        if done:
            self._recount()
        return done

    def needs_identity(self, code: int) -> bool:
        """Whether matching ``code`` needs the request's group / client id."""
        return any(
            f.request_code == code and (f.group is not None or f.client_id is not None)
            for f in self.faults.values()
        )

    def match(
        self, code: int, group: str | None, client_id: str | None, now_ms: int
    ) -> tuple[FaultAction | None, list[Fault]]:
        """The action for one request (the oldest matching fault applies), and faults that ended."""
        ended = self.sweep(now_ms)
        for f in self.faults.values():
            if not f.matches(code, group, client_id):
                continue
            error = f.errors[min(f.applied, len(f.errors) - 1)] if f.errors else None
            f.applied += 1
            action = FaultAction(f.fault_id, error, f.latency_ms, f.drop)
            ended.extend(self.sweep(now_ms))
            return action, ended
        return None, ended

    def _recount(self) -> None:
        self.codes = {f.request_code for f in self.faults.values()}
