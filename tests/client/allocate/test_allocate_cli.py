"""rmq-allocate: tables, moves on leave/join, --compare, --json and argument errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rmqlab.client.allocate_cli import broker_name, main


def run(capsys: pytest.CaptureFixture[str], args: str) -> str:
    assert main(args.split()) == 0
    return capsys.readouterr().out


def run_json(capsys: pytest.CaptureFixture[str], args: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(run(capsys, args + " --json"))
    return doc


def test_table_for_the_documented_example(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--queues 16 --brokers 2 --consumers 5 --strategy AVG")
    assert "2 broker(s) x 16 queues = 32 queues; 5 consumer(s); strategy AVG" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("consumer-")}
    assert rows["consumer-00"] == ["7", *[f"broker-a:{i}" for i in range(7)]]
    assert rows["consumer-02"] == [
        "6",
        "broker-a:14",
        "broker-a:15",
        "broker-b:0",
        "broker-b:1",
        "broker-b:2",
        "broker-b:3",
    ]
    assert rows["consumer-04"][0] == "6" and rows["consumer-04"][-1] == "broker-b:15"
    assert "balance (max-min queues per consumer): 1" in out


def test_topic_option_and_default_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--queues 3 --consumers 2 --topic Orders")
    assert doc["topic"] == "Orders" and doc["brokers"] == ["broker-a"]
    (result,) = doc["strategies"]
    assert result["strategy"] == "AVG"
    assert result["before"]["allocation"] == {
        "consumer-00": ["broker-a:0", "broker-a:1"],
        "consumer-01": ["broker-a:2"],
    }
    assert "after" not in result and doc["consumers_after"] is None


def test_leave_moves_only_what_avg_must_move(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--queues 8 --brokers 2 --consumers 4 --strategy AVG --leave 1")
    assert "change: 1 leave (consumer-03) -> 3 consumer(s)" in out
    # before 4/4/4/4, after 6/5/5: blocks shift along the sorted list, so 2 + 3 + 4 queues move
    assert "moved: 9 of 16 queues" in out
    assert "  broker-a:4: consumer-01 -> consumer-00" in out
    assert "balance: before 0, after 1" in out


def test_leave_and_join_json(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--queues 6 --consumers 3 --strategy AVG_BY_CIRCLE --leave 1 --join 1")
    assert doc["left"] == ["consumer-02"] and doc["joined"] == ["consumer-03"]
    assert doc["consumers_after"] == ["consumer-00", "consumer-01", "consumer-03"]
    (r,) = doc["strategies"]
    # the newcomer takes the leaver's place in the sorted list, so exactly its queues move
    assert r["moved"] == [
        {"queue": "broker-a:2", "from": "consumer-02", "to": "consumer-03"},
        {"queue": "broker-a:5", "from": "consumer-02", "to": "consumer-03"},
    ]
    assert r["before"]["balance"] == 0 and r["after"]["balance"] == 0


def test_leave_from_first(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--queues 4 --consumers 2 --leave 1 --leave-from first")
    assert doc["left"] == ["consumer-00"]
    (r,) = doc["strategies"]
    assert r["after"]["allocation"] == {"consumer-01": [f"broker-a:{i}" for i in range(4)]}
    assert [m["queue"] for m in r["moved"]] == ["broker-a:0", "broker-a:1"]


def test_consistent_hash_join_moves_queues_only_to_the_newcomer(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--queues 16 --brokers 3 --consumers 4 --strategy CONSISTENT_HASH --join 2")
    (r,) = doc["strategies"]
    assert r["moved"], "two new consumers on a 48-queue ring take something"
    assert {m["to"] for m in r["moved"]} <= {"consumer-04", "consumer-05"}


def test_zero_virtual_nodes_leaves_everything_unassigned(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--queues 3 --consumers 2 --strategy CONSISTENT_HASH --vnodes 0")
    assert "unassigned: 3 (broker-a:0 broker-a:1 broker-a:2)" in out


def test_compare_without_change(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--queues 8 --brokers 2 --consumers 3 --compare")
    for name in ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "MACHINE_ROOM_NEARBY-AVG"):
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    assert (
        "skipped:" in out and "  CONFIG: " in out and "  MACHINE_ROOM: needs brokers named room@broker" in out
    )
    assert "CONSISTENT_HASH uses 10 virtual nodes" in out and "into 2 room(s)" in out


def test_compare_with_change_json(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "--queues 8 --brokers 2 --consumers 5 --compare --leave 1 --join 1")
    by_name = {r["strategy"]: r for r in doc["strategies"]}
    assert list(by_name) == ["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "MACHINE_ROOM_NEARBY-AVG"]
    assert set(doc["skipped"]) == {"CONFIG", "MACHINE_ROOM"}
    for r in by_name.values():
        assert sum(r["after"]["counts"].values()) == 16 and r["after"]["unassigned"] == []
        # the leaver's queues always move
        assert {m["queue"] for m in r["moved"]} >= {q for q in r["before"]["allocation"]["consumer-04"]}
    # consumer-05 sorts where consumer-04 was: AVG and AVG_BY_CIRCLE move exactly the leaver's queues
    assert len(by_name["AVG"]["moved"]) == len(by_name["AVG"]["before"]["allocation"]["consumer-04"])


def test_compare_text_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--queues 4 --consumers 2 --compare --join 1")
    assert "queues per consumer (before -> after):" in out
    newcomer = next(line for line in out.splitlines() if line.startswith("consumer-02"))
    assert newcomer.split()[1:4] == ["-", "->", "1"]  # AVG: 2/2 -> 2/1/1


def test_machine_room_nearby_rooms_and_inner(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(
        capsys, "--queues 2 --brokers 2 --consumers 2 --strategy machine_room_nearby --inner AVG_BY_CIRCLE"
    )
    (r,) = doc["strategies"]
    assert r["strategy"] == "MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE"
    # broker-a and consumer-00 share room0, broker-b and consumer-01 room1
    assert r["before"]["allocation"] == {
        "consumer-00": ["broker-a:0", "broker-a:1"],
        "consumer-01": ["broker-b:0", "broker-b:1"],
    }
    # one broker: with 2 rooms consumer-01 sits in a room without brokers and gets nothing
    two_rooms = run_json(capsys, "--queues 4 --consumers 2 --strategy MACHINE_ROOM_NEARBY")
    assert two_rooms["strategies"][0]["before"]["counts"] == {"consumer-00": 4, "consumer-01": 0}
    one_room = run_json(capsys, "--queues 4 --consumers 2 --strategy MACHINE_ROOM_NEARBY --rooms 1")
    assert one_room["strategies"][0]["before"]["counts"] == {"consumer-00": 2, "consumer-01": 2}


def test_broker_names() -> None:
    assert [broker_name(i) for i in (0, 1, 25, 26, 27, 701)] == [
        "broker-a",
        "broker-b",
        "broker-z",
        "broker-aa",
        "broker-ab",
        "broker-zz",
    ]


BASE = ["--queues", "4", "--consumers", "2"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: --queues, --consumers"),
        (["--queues", "0", "--consumers", "2"], "argument --queues: must be between 1 and 4096, got 0"),
        (["--queues", "x", "--consumers", "2"], "argument --queues: expected an integer, got 'x'"),
        (["--queues", "4", "--consumers", "0"], "argument --consumers: must be between 1"),
        ([*BASE, "--brokers", "0"], "argument --brokers: must be between 1"),
        ([*BASE, "--strategy", "STICKY"], "unknown strategy 'STICKY'"),
        ([*BASE, "--strategy", "CONFIG"], "CONFIG cannot be simulated here"),
        ([*BASE, "--strategy", "MACHINE_ROOM"], "needs brokers named room@broker"),
        ([*BASE, "--strategy", "MACHINE_ROOM_NEARBY-AVG"], "--inner"),
        ([*BASE, "--inner", "CONFIG"], "argument --inner: unknown inner strategy"),
        ([*BASE, "--compare", "--strategy", "AVG"], "not allowed with argument"),
        ([*BASE, "--leave", "3"], "--leave 3: only 2 consumer(s) to leave"),
        ([*BASE, "--leave", "2"], "--leave 2 leaves no consumer"),
        ([*BASE, "--leave", "-1"], "argument --leave: must be between 0"),
        ([*BASE, "--vnodes", "-1"], "argument --vnodes: must be between 0"),
        ([*BASE, "--rooms", "0"], "argument --rooms: must be between 1"),
        (["--queues", "4000", "--consumers", "2", "--brokers", "3"], "12000 queues; at most 10000"),
        (["--queues", "4", "--consumers", "999", "--join", "5"], "--consumers + --join = 1004; at most 1000"),
        ([*BASE, "--topic", " "], "--topic must not be empty"),
        ([*BASE, "--leave-from", "middle"], "argument --leave-from: invalid choice"),
    ],
)
def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "rmq-allocate: error:" in err and message in err
