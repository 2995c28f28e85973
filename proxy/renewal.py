"""Receipt handles a push consumer holds, renewed by the proxy (RocketMQ 5's DefaultReceiptHandleManager),
without I/O: the service asks what is due and reports what the broker answered.

A push consumer receives with ``auto_renew``: the proxy pops with its default invisible time (60 s) and
keeps every message's receipt until the client acks it, changes its invisible time or forwards it to the
DLQ. Every scan (5 s) each receipt within 10 s of becoming visible is renewed (CHANGE_MESSAGE_INVISIBLETIME
for 1, 3, 5, 10, 30 min, then 1 h each time) while its client is online, for at most 3 h after the pop;
past that it is handed back with the group's retry delay. A client that goes offline (terminated, or
silent past the channel expiry) has its receipts cleared: each message becomes visible 1 s later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

RENEW_AHEAD_MS = 10_000  # ProxyConfig.renewAheadTimeMillis
RENEW_MAX_MS = 3 * 3600 * 1000  # renewMaxTimeMillis
RENEW_PERIOD_MS = 5_000  # renewSchedulePeriodMillis
MAX_RENEW_RETRY_TIMES = 3  # maxRenewRetryTimes
INVISIBLE_MS_WHEN_CLEAR = 1_000  # invisibleTimeMillisWhenClear
# RenewStrategyPolicy: the invisible time of the n-th renewal (the last one repeats)
RENEW_POLICY_MS = (60_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000)


def renew_delay_ms(renew_times: int) -> int:
    return RENEW_POLICY_MS[min(max(renew_times, 0), len(RENEW_POLICY_MS) - 1)]


@dataclass(slots=True)
class HeldReceipt:
    """MessageReceiptHandle: one message a client holds, with the receipt the broker knows now."""

    client_id: str
    group: str
    topic: str
    msg_id: str
    original: str  # the receipt the client got (and acks with)
    current: str  # the newest receipt, after renewals
    next_visible_ms: int
    consume_ms: int  # when it was popped: renewal stops 3 h later
    reconsume_times: int
    renew_times: int = 0
    retry_times: int = 0


@dataclass(frozen=True, slots=True)
class Renewal:
    """A CHANGE_MESSAGE_INVISIBLETIME the proxy sends on its own: RENEW, STOP_RENEW or CLEAR_GROUP."""

    kind: str
    held: HeldReceipt
    invisible_ms: int


@dataclass(slots=True)
class ReceiptHandles:
    """The table of held receipts by (client id, group), then message id."""

    groups: dict[tuple[str, str], dict[str, HeldReceipt]] = field(default_factory=dict)

    def add(self, held: HeldReceipt) -> None:
        self.groups.setdefault((held.client_id, held.group), {})[held.msg_id] = held

    def remove(self, client_id: str, group: str, msg_id: str, receipt: str) -> HeldReceipt | None:
        """ReceiptHandleGroup.remove: the held receipt the client answers for (matched by the receipt it
        was given), no longer renewed; None when the proxy does not hold it."""
        held = self.groups.get((client_id, group), {}).get(msg_id)
        if held is None or held.original != receipt:
            return None
        del self.groups[(client_id, group)][msg_id]
        return held

    def due(
        self, now_ms: int, online: Callable[[str, str], bool], retry_delay_ms: Callable[[int], int]
    ) -> list[Renewal]:
        """scheduleRenewTask: what to send now. Offline clients' receipts are cleared (and forgotten);
        receipts within RENEW_AHEAD_MS of their visibility are renewed, or handed back past RENEW_MAX_MS
        (and forgotten)."""
        out: list[Renewal] = []
        for key in sorted(self.groups):
            held_by_id = self.groups[key]
            if not online(*key):
                del self.groups[key]
                out += [
                    Renewal("CLEAR_GROUP", h, INVISIBLE_MS_WHEN_CLEAR) for _, h in sorted(held_by_id.items())
                ]
                continue
            for msg_id, h in sorted(held_by_id.items()):
                if h.next_visible_ms - now_ms > RENEW_AHEAD_MS:
                    continue
                if now_ms - h.consume_ms < RENEW_MAX_MS:
                    out.append(Renewal("RENEW", h, renew_delay_ms(h.renew_times)))
                else:
                    del held_by_id[msg_id]
                    out.append(Renewal("STOP_RENEW", h, retry_delay_ms(h.reconsume_times)))
        return out

    def renewed(self, held: HeldReceipt, receipt: str, next_visible_ms: int) -> None:
        held.current = receipt
        held.next_visible_ms = next_visible_ms
        held.retry_times = 0
        held.renew_times += 1

    def renew_failed(self, held: HeldReceipt, retry: bool) -> None:
        """A failed renewal is tried again at the next scan, up to MAX_RENEW_RETRY_TIMES, unless the
        broker no longer holds the receipt."""
        held.retry_times += 1
        if not retry or held.retry_times >= MAX_RENEW_RETRY_TIMES:
            group = self.groups.get((held.client_id, held.group), {})
            if group.get(held.msg_id) is held:
                del group[held.msg_id]

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups.values())
