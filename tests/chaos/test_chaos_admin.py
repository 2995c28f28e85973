"""rmq-admin against a stand-in broker on the real protocol: what it sends, prints and exits with."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rmqlab.chaos.admin_main import main
from rmqlab.chaos.supervisor import pick_port
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.remoting import RemotingServer


class FakeBroker:
    """A RemotingServer on its own thread that records admin requests and answers like a broker."""

    def __init__(self) -> None:
        self.requests: list[RemotingCommand] = []
        self.fail_with: tuple[int, str] | None = None
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.address = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self.ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.server = RemotingServer()

        async def handle(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
            self.requests.append(cmd)
            if self.fail_with:
                return cmd.response(self.fail_with[0], self.fail_with[1])
            if cmd.code == RequestCode.ADMIN_FAULT_ADD:
                return cmd.response(ext={"faultId": 7})
            if cmd.code == RequestCode.ADMIN_FAULT_LIST:
                return cmd.response(body={"faults": [{"faultId": 7, "requestCode": 11}]})
            if cmd.code == RequestCode.ADMIN_BROKER_STATUS:
                return cmd.response(body={"topics": 2, "messages": 10})
            return cmd.response()

        for code in (
            9000,
            9001,
            9002,
            9003,
            9004,
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            RequestCode.SET_MESSAGE_REQUEST_MODE,
        ):
            self.server.register(code, handle)
        await self.server.start()
        self.address = self.server.address

    def __enter__(self) -> FakeBroker:
        self.thread.start()
        self.ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as b:
        yield b


def test_fault_add_sends_the_full_spec(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "--broker",
            broker.address,
            "fault",
            "add",
            "--code",
            "PULL_MESSAGE",
            "--error",
            '1:boom "loud"',
            "--error",
            "14",
            "--count",
            "3",
            "--group",
            "g1",
            "--client-id",
            "1.2.3.4@9",
            "--latency-ms",
            "50",
            "--duration-ms",
            "2000",
        ]
    )
    assert rc == 0
    assert capsys.readouterr().out.strip() == "fault 7 added"
    [req] = broker.requests
    assert req.code == RequestCode.ADMIN_FAULT_ADD
    assert req.body == {
        "requestCode": 11,
        "group": "g1",
        "clientId": "1.2.3.4@9",
        "errors": [{"code": 1, "remark": 'boom "loud"'}, {"code": 14, "remark": "injected fault"}],
        "latencyMs": 50,
        "drop": False,
        "count": 3,
        "durationMs": 2000,
    }


def test_fault_clear_list_policy_status_topic(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    b = ["--broker", broker.address]
    assert main([*b, "fault", "clear", "--id", "3"]) == 0
    assert main([*b, "fault", "clear"]) == 0
    assert main([*b, "fault", "list"]) == 0
    listed = capsys.readouterr().out.split("cleared all faults\n", 1)[1]
    assert json.loads(listed) == [{"faultId": 7, "requestCode": 11}]
    assert main([*b, "policy", "--notify-on-channel-expired", "on", "--release-locks-on-close", "off"]) == 0
    assert main([*b, "status"]) == 0
    assert json.loads(capsys.readouterr().out.split("policy updated\n", 1)[1]) == {
        "topics": 2,
        "messages": 10,
    }
    assert main([*b, "topic", "create", "--topic", "TopicA", "--queues", "8"]) == 0
    codes = [(r.code, r.ext) for r in broker.requests]
    assert codes == [
        (RequestCode.ADMIN_FAULT_CLEAR, {"faultId": 3}),
        (RequestCode.ADMIN_FAULT_CLEAR, {}),
        (RequestCode.ADMIN_FAULT_LIST, {}),
        (RequestCode.ADMIN_POLICY_SET, {"notifyOnChannelExpired": True, "releaseLocksOnChannelClose": False}),
        (RequestCode.ADMIN_BROKER_STATUS, {}),
        (
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "TopicA", "readQueueNums": 8, "writeQueueNums": 8, "perm": 6},
        ),
    ]


def test_error_response_exits_1_with_remark(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    broker.fail_with = (ResponseCode.INVALID_PARAMETER, "body.requestCode: admin codes cannot be faulted")
    assert main(["--broker", broker.address, "fault", "add", "--code", "9000", "--drop"]) == 1
    err = capsys.readouterr().err
    assert "INVALID_PARAMETER (29)" in err and "admin codes cannot be faulted" in err


def test_unreachable_broker_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    port = pick_port()
    assert main(["--broker", f"127.0.0.1:{port}", "--timeout", "1", "status"]) == 3
    assert "cannot reach broker" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fault", "add", "--code", "11"], "needs at least one of --error"),
        (["fault", "add", "--code", "11", "--error", "x:y"], "integer CODE"),
        (["fault", "add", "--code", "NOPE", "--drop"], "unknown request code"),
        (["policy"], "policy needs"),
        (["policy", "--release-locks-on-close", "maybe"], "expected on or off"),
        (["topic", "create", "--topic", "T", "--queues", "0"], "must be > 0"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--broker", "127.0.0.1:1", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_group_request_mode(broker: FakeBroker, capsys: pytest.CaptureFixture[str]) -> None:
    b = ["--broker", broker.address]
    cmd = [
        *b,
        "group",
        "request-mode",
        "--group",
        "g",
        "--topic",
        "T",
        "--mode",
        "POP",
        "--pop-share-queue-num",
        "1",
    ]
    assert main(cmd) == 0
    assert capsys.readouterr().out.strip() == "group g reads T in POP mode"
    [req] = broker.requests
    assert req.code == RequestCode.SET_MESSAGE_REQUEST_MODE
    assert req.body == {"topic": "T", "consumerGroup": "g", "mode": "POP", "popShareQueueNum": 1}
    broker.fail_with = (ResponseCode.TOPIC_NOT_EXIST, "topic[T] not exist")
    assert main(cmd) == 1
    assert "TOPIC_NOT_EXIST" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*b, "group", "request-mode", "--group", "g", "--topic", "T", "--mode", "PUSH"])
