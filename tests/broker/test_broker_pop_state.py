"""POP's sans-IO state: checkpoints, acks, revive, the safe consumer offset, orderly order infos, and the
receipt format."""

from __future__ import annotations

import pytest

from rmqlab.broker.pop_state import REVIVE_DELAY_MS, AckResult, PopCheckPoint, PopState
from rmqlab.protocol.pop_receipt import ExtraInfo, bitset_indices, offset_info, pop_retry_topic, real_topic

KEY = ("g", "T", 0)


def ck(start: int, offsets: tuple[int, ...], pop_time: int = 1_000, invisible: int = 60_000) -> PopCheckPoint:
    return PopCheckPoint("g", "T", 0, start, pop_time, invisible, 0, "broker-a", offsets)


def test_acks_close_a_checkpoint_and_move_the_safe_offset() -> None:
    s = PopState()
    assert s.commit_offset(KEY) is None
    assert s.pop_offset(KEY, 5) == 5
    a, b = ck(0, (0, 1, 2), pop_time=1), ck(3, (3, 4), pop_time=2)
    s.add_checkpoint(a, 3)
    s.add_checkpoint(b, 5)
    assert s.pop_offset(KEY, 0) == 5 and s.pop_offset(KEY, 7) == 7
    assert s.commit_offset(KEY) == 0 and s.in_flight() == 5
    assert s.ack("g", "T", 0, 3, 2, 3) == (AckResult.ACKED, b)
    assert s.ack("g", "T", 0, 3, 2, 3) == (AckResult.ALREADY_ACKED, b)
    assert s.ack("g", "T", 0, 3, 2, 9) == (AckResult.NOT_IN_CHECKPOINT, b)
    assert s.ack("g", "T", 0, 3, 99, 3) == (AckResult.NO_CHECKPOINT, None)
    assert s.ack("g", "T", 0, 3, 2, 4)[0] is AckResult.ACKED
    assert len(s) == 1 and s.commit_offset(KEY) == 0  # the older checkpoint is still open
    for o in (0, 1, 2):
        s.ack("g", "T", 0, 0, 1, o)
    assert len(s) == 0 and s.commit_offset(KEY) == 5 and s.in_flight() == 0
    s.skip(KEY, 8)  # filtered-out messages move the pop offset
    assert s.commit_offset(KEY) == 8


def test_due_waits_for_the_revive_time_plus_the_delay() -> None:
    s = PopState()
    late, early = ck(2, (2,), pop_time=500, invisible=1_000), ck(0, (0, 1), pop_time=100, invisible=1_000)
    s.add_checkpoint(late, 3)
    s.add_checkpoint(early, 2)
    s.ack("g", "T", 0, 0, 100, 1)
    assert s.due(1_100 + REVIVE_DELAY_MS - 1) == []
    assert s.due(1_100 + REVIVE_DELAY_MS) == [early]
    assert s.due(1_500 + REVIVE_DELAY_MS) == [early, late]
    assert early.unacked() == [0]
    s.revived(early)
    assert s.commit_offset(KEY) == 2 and s.due(10**9) == [late]


def test_revive_queue_ids_cycle() -> None:
    s = PopState(revive_queue_num=3)
    assert [s.next_revive_qid() for _ in range(5)] == [0, 1, 2, 0, 1]


def test_orderly_blocks_until_acked_or_invisible_time_ends() -> None:
    s = PopState()
    assert s.check_block(KEY, None, 0) is False
    assert s.update_order(KEY, "a1", 1_000, 500, [4, 5, 6]) == {4: 0, 5: 0, 6: 0}
    assert s.check_block(KEY, "other", 1_499) is True
    assert s.check_block(KEY, "a1", 1_499) is False  # the same attempt is not blocked
    assert s.check_block(KEY, None, 1_500) is False  # invisible time over
    assert s.ack_order(KEY, 5, 999) == -2  # an older pop's receipt
    assert s.ack_order(KEY, 9, 1_000) == -1
    assert s.ack_order(KEY, 5, 1_000) == 4  # 4 is still unacked
    assert s.ack_order(KEY, 4, 1_000) == 6
    assert s.change_order_invisible_time(KEY, 6, 5_000) is True
    assert s.change_order_invisible_time(KEY, 7, 5_000) is False
    assert s.check_block(KEY, None, 4_999) is True and s.check_block(KEY, None, 5_000) is False
    # popped again by another attempt: 6 counts one more consumption, the new offset 7 none
    assert s.update_order(KEY, "a2", 6_000, 500, [6, 7]) == {6: 1, 7: 0}
    assert s.update_order(KEY, "a2", 7_000, 500, [6, 7]) == {6: 1, 7: 0}  # same attempt: no new count
    assert s.ack_order(KEY, 6, 7_000) == 7 and s.ack_order(KEY, 7, 7_000) == 8
    assert s.ack_order(("g", "T", 3), 2, 1) == 3  # no order info: the next offset


def test_receipt_round_trip_and_errors() -> None:
    r = ExtraInfo(3, 1_700_000_000_000, 60_000, 5, "1", "broker-a", 0, 4)
    text = r.build()
    assert text == "3 1700000000000 60000 5 1 broker-a 0 4"
    assert ExtraInfo.parse(text) == r and r.revive_time == 1_700_000_060_000 and not r.is_order
    assert ExtraInfo.parse("0 1 2 999 0 b 0 0").is_order
    with pytest.raises(ValueError, match="8 space-separated fields"):
        ExtraInfo.parse("1 2 3")
    with pytest.raises(ValueError, match="popTime is not a number"):
        ExtraInfo.parse("0 x 2 0 0 b 0 0")
    with pytest.raises(ValueError, match="retry must be 0 or 1"):
        ExtraInfo.parse("0 1 2 0 7 b 0 0")
    with pytest.raises(ValueError, match="brokerName is empty"):
        ExtraInfo.parse("0 1 2 0 0  0 0")
    assert pop_retry_topic("T", "g") == "%RETRY%g_T"
    assert real_topic("T", "g", "0") == "T" and real_topic("T", "g", "1") == "%RETRY%g_T"
    with pytest.raises(ValueError):
        real_topic("T", "g", "2")
    assert offset_info("%RETRY%g_T", 0, [4, 5]) == "1 0 4,5" and offset_info("T", 2, 7) == "0 2 7"
    assert bitset_indices(bytes([0b101, 0b1])) == [0, 2, 8]
