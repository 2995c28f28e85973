"""The proxy's table of held receipts (DefaultReceiptHandleManager), sans-IO: what each scan renews,
hands back or clears, and which receipt an ack uses."""

from __future__ import annotations

from rmqlab.proxy.renewal import (
    INVISIBLE_MS_WHEN_CLEAR,
    MAX_RENEW_RETRY_TIMES,
    RENEW_AHEAD_MS,
    RENEW_MAX_MS,
    HeldReceipt,
    ReceiptHandles,
    renew_delay_ms,
)

T0 = 1_700_000_000_000


def held(
    msg_id: str = "m1", client: str = "c1", visible: int = T0 + 60_000, reconsume: int = 0
) -> HeldReceipt:
    return HeldReceipt(client, "g", "T", msg_id, f"rh-{msg_id}", f"rh-{msg_id}", visible, T0, reconsume)


def retry_delay(reconsume_times: int) -> int:
    return 1000 * (reconsume_times + 1)


def online(*_: str) -> bool:
    return True


def test_renewal_waits_until_ten_seconds_before_visibility() -> None:
    t = ReceiptHandles()
    t.add(held())
    assert t.due(T0 + 60_000 - RENEW_AHEAD_MS - 1, online, retry_delay) == []
    [r] = t.due(T0 + 60_000 - RENEW_AHEAD_MS, online, retry_delay)
    assert (r.kind, r.invisible_ms, r.held.msg_id) == ("RENEW", 60_000, "m1")


def test_renew_policy_grows_then_repeats_the_last_step() -> None:
    assert [renew_delay_ms(i) for i in range(8)] == [
        60_000,
        180_000,
        300_000,
        600_000,
        1_800_000,
        3_600_000,
        3_600_000,
        3_600_000,
    ]
    t = ReceiptHandles()
    h = held()
    t.add(h)
    t.renewed(h, "rh-new", T0 + 200_000)
    assert (h.current, h.original, h.renew_times, h.next_visible_ms) == ("rh-new", "rh-m1", 1, T0 + 200_000)
    [r] = t.due(T0 + 195_000, online, retry_delay)
    assert r.invisible_ms == 180_000


def test_past_three_hours_the_message_is_handed_back_with_the_retry_delay() -> None:
    t = ReceiptHandles()
    t.add(held(visible=T0 + RENEW_MAX_MS, reconsume=2))
    [r] = t.due(T0 + RENEW_MAX_MS - 1, online, retry_delay)
    assert r.kind == "RENEW"
    [r] = t.due(T0 + RENEW_MAX_MS, online, retry_delay)
    assert (r.kind, r.invisible_ms) == ("STOP_RENEW", 3000)
    assert len(t) == 0


def test_an_offline_clients_receipts_are_cleared_and_forgotten() -> None:
    t = ReceiptHandles()
    t.add(held("m1", "gone"))
    t.add(held("m2", "gone"))
    t.add(held("m3", "here"))
    got = t.due(T0, lambda cid, _g: cid == "here", retry_delay)
    assert [(r.kind, r.held.msg_id, r.invisible_ms) for r in got] == [
        ("CLEAR_GROUP", "m1", INVISIBLE_MS_WHEN_CLEAR),
        ("CLEAR_GROUP", "m2", INVISIBLE_MS_WHEN_CLEAR),
    ]
    assert len(t) == 1 and t.due(T0, lambda *_: True, retry_delay) == []


def test_remove_matches_the_receipt_the_client_was_given() -> None:
    t = ReceiptHandles()
    h = held()
    t.add(h)
    t.renewed(h, "rh-new", T0 + 100_000)
    assert t.remove("c1", "g", "m1", "rh-new") is None  # not the client's receipt
    assert t.remove("c2", "g", "m1", "rh-m1") is None  # not its client
    assert t.remove("c1", "g", "m1", "rh-m1") is h
    assert len(t) == 0 and t.remove("c1", "g", "m1", "rh-m1") is None


def test_failed_renewals_are_retried_a_few_times_unless_the_broker_dropped_the_receipt() -> None:
    t = ReceiptHandles()
    h = held()
    t.add(h)
    for _ in range(MAX_RENEW_RETRY_TIMES - 1):
        t.renew_failed(h, retry=True)
        assert len(t) == 1
    t.renew_failed(h, retry=True)
    assert len(t) == 0
    h2 = held("m2")
    t.add(h2)
    t.renew_failed(h2, retry=False)
    assert len(t) == 0
