"""RocketMQ 4.9's plain ACL (``--acl plain_acl.yml``) and the loopback-only admin codes without it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import subprocess
import sys
import time

import pytest
from kit import wait_until
from kit.broker import Peer
from kit.native_wire import NativePeer, decode_messages, json_frame

from rmqlab.broker.plain_acl import AclConfigError, load_acl_config
from rmqlab.protocol.acl_signing import SessionCredentials, cal_signature, combine_request_content
from rmqlab.protocol.codes import RequestCode, ResponseCode
from rmqlab.protocol.command import RemotingCommand
from rmqlab.protocol.pop_receipt import PROPERTY_POP_CK, ExtraInfo
from rmqlab.protocol.remoting import RemotingClient

ACL = """\
# plain_acl.yml as RocketMQ ships it, with this test's accounts
globalWhiteRemoteAddresses:
  - 10.10.103.*

accounts:
  - accessKey: consumer1
    secretKey: secret-c1
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - T=PUB|SUB
      - Secret=DENY
    groupPerms:
      - closed=DENY

  - accessKey: "adminuser"
    secretKey: 'admin-secret'
    admin: true
"""
CONSUMER = SessionCredentials("consumer1", "secret-c1")
ADMIN = SessionCredentials("adminuser", "admin-secret")


@pytest.fixture
async def acl_broker(make_broker, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    return await make_broker(time_scale=0.01, acl_file=str(path))


class Signed(Peer):
    def __init__(self, addr: str, credentials: SessionCredentials | None) -> None:
        super().__init__(addr)
        self.rc = RemotingClient(connect_timeout_s=2.0, credentials=credentials)
        self.rc.register(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)


def test_the_signature_is_hmac_sha1_over_sorted_values_and_body():
    ext: dict = {"topic": "T", "queueId": 3, "consumerGroup": "g"}
    from rmqlab.protocol.acl_signing import sign_ext

    sign_ext(ext, None, CONSUMER)
    content = "".join(str(ext[k]) for k in sorted(ext) if k != "Signature").encode()
    expected = base64.b64encode(hmac.new(b"secret-c1", content, hashlib.sha1).digest()).decode()
    assert ext["AccessKey"] == "consumer1" and ext["Signature"] == expected


def test_plain_acl_yml_is_read_as_rocketmq_reads_it():
    cfg = load_acl_config(ACL)
    c1 = cfg.accounts["consumer1"]
    assert (c1.admin, c1.default_topic_perm, c1.default_group_perm) == (False, 1, 8)
    assert c1.resource_perms == {"%RETRY%closed": 1, "T": 12, "Secret": 1}
    assert cfg.accounts["adminuser"].admin and cfg.accounts["adminuser"].secret_key == "admin-secret"
    assert cfg.global_white[0]("10.10.103.9") and not cfg.global_white[0]("10.10.104.9")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("accounts:\n  - accessKey: short\n    secretKey: 12345678\n", "acl.yml:2"),
        (
            "accounts:\n  - accessKey: longenough\n    secretKey: 12345678\n    topicPerms:\n      - T\n",
            "acl.yml:5",
        ),
        ("accounts:\n  - accessKey: longenough\n    secretKey: 12345678\n   admin: true\n", "acl.yml:4"),
        ("accounts: [a, b]\n", "acl.yml:1"),
        ("acounts:\n  - x\n", "acl.yml:1"),
    ],
)
def test_a_bad_acl_file_names_file_and_line(text, where):
    with pytest.raises(AclConfigError, match=f"^{where}: "):
        load_acl_config(text, "acl.yml")


async def test_unsigned_and_badly_signed_requests_are_refused(acl_broker, make_peer):
    unsigned = make_peer(acl_broker.address)
    resp = await unsigned.call(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
    assert resp.code == ResponseCode.NO_PERMISSION and "No accessKey" in (resp.remark or "")
    wrong = Signed(acl_broker.address, SessionCredentials("consumer1", "not-the-secret"))
    try:
        resp = await wrong.call(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
        assert resp.code == ResponseCode.NO_PERMISSION and "signature" in (resp.remark or "")
    finally:
        await wrong.close()
    stranger = Signed(acl_broker.address, SessionCredentials("nobody1", "whatever1"))
    try:
        resp = await stranger.call(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
        assert resp.code == ResponseCode.NO_PERMISSION and "No acl config for nobody1" in (resp.remark or "")
    finally:
        await stranger.close()
    assert acl_broker.log.of("request_refused")


async def test_a_signed_client_works_within_its_permissions(acl_broker):
    p = Signed(acl_broker.address, CONSUMER)
    try:
        await p.heartbeat("c1", group="g", topics=["T"])
        assert (await p.send("T", body=b"hello")).code == ResponseCode.SUCCESS
        resp = await p.pull("T", 0)
        assert resp.code == ResponseCode.SUCCESS and resp.body["messages"][0]["body"] == b"hello"
        await p.ok(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "g", "topic": "T", "queueId": 0, "commitOffset": 1},
        )
        # DENY on a topic, DENY on a group, and the DENY default for topics not listed
        assert (await p.send("Secret")).code == ResponseCode.NO_PERMISSION
        assert (await p.send("Other")).code == ResponseCode.NO_PERMISSION
        resp = await p.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "closed", "topic": "T", "queueId": 0, "commitOffset": 1},
        )
        assert resp.code == ResponseCode.NO_PERMISSION
        assert resp.remark == "No default permission for group:closed"
        # admin-only codes
        for code, ext, body in [
            (
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {"topic": "New", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
                None,
            ),
            (RequestCode.ADMIN_FAULT_ADD, {}, {"requestCode": 34, "errors": [{"code": 1}]}),
            (
                RequestCode.REGISTER_BROKER,
                {"brokerName": "evil", "brokerAddr": "1.2.3.4:1", "clusterName": "c", "brokerId": 0},
                None,
            ),
        ]:
            resp = await p.call(code, ext, body)
            assert resp.code == ResponseCode.NO_PERMISSION and "Need admin permission" in (resp.remark or "")
        assert "New" not in acl_broker.topic_manager.table and len(acl_broker.faults) == 0
    finally:
        await p.close()
    admin = Signed(acl_broker.address, ADMIN)
    try:
        await admin.ok(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {"topic": "New", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
        )
        await admin.ok(RequestCode.ADMIN_FAULT_ADD, body={"requestCode": 34, "errors": [{"code": 1}]})
    finally:
        await admin.close()


async def test_the_global_whitelist_needs_no_signature(make_broker, make_peer, tmp_path):
    path = tmp_path / "acl.yml"
    path.write_text("globalWhiteRemoteAddresses:\n  - 127.0.0.*\naccounts:\n")
    b = await make_broker(time_scale=0.01, acl_file=str(path))
    p = make_peer(b.address)
    await p.ok(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})


def _outward_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.200", 9))  # no packet is sent; this only picks the outgoing interface
        except OSError:
            return None
        ip = s.getsockname()[0]
    return None if ip.startswith("127.") else ip


async def test_admin_codes_only_from_loopback_unless_admin_from_any(make_broker):
    ip = _outward_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    for admin_from, allowed in (("loopback", False), ("any", True)):
        b = await make_broker(time_scale=0.01, host="0.0.0.0", admin_from=admin_from)
        client = RemotingClient()
        try:
            addr = f"{ip}:{b.port}"
            fault = RemotingCommand.request(
                RequestCode.ADMIN_FAULT_ADD, body={"requestCode": 34, "errors": [{"code": 1}]}
            )
            resp = await client.invoke(addr, fault, 5)
            assert (resp.code == ResponseCode.SUCCESS) is allowed, resp.remark
            topic = RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {"topic": "X", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
            )
            assert ((await client.invoke(addr, topic, 5)).code == ResponseCode.SUCCESS) is allowed
            # ordinary codes are for everyone
            ping = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
            assert (await client.invoke(addr, ping, 5)).code == ResponseCode.SUCCESS
        finally:
            await client.close()
    # and from loopback they always work
    local = RemotingClient()
    try:
        resp = await local.invoke(
            b.address.replace("0.0.0.0", "127.0.0.1"),
            RemotingCommand.request(RequestCode.ADMIN_FAULT_LIST),
            5,
        )
        assert resp.code == ResponseCode.SUCCESS
    finally:
        await local.close()


def test_the_broker_cli_refuses_a_bad_acl_file(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("accounts:\n  - accessKey: ab\n    secretKey: 12345678\n")
    proc = subprocess.run(
        [sys.executable, "-m", "rmqlab.broker", "--port", "0", "--acl", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0 and f"{path}:2:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("", [], ["127.0.0.1"]),
        ("*", ["1.2.3.4", "::1"], []),
        ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1", "192.168.1", "::1"]),
        ("10.0.0.10-20", ["10.0.0.10", "10.0.0.20"], ["10.0.0.9", "10.0.0.21"]),
        ("1.2.3.{4,5}", ["1.2.3.4", "1.2.3.5"], ["1.2.3.6"]),
        ("1.1.1.1,2.2.2.2", ["2.2.2.2"], ["3.3.3.3"]),
        ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2"]),
    ],
)
def test_white_remote_address_patterns(pattern, yes, no):
    from rmqlab.broker.plain_acl import address_matcher

    match = address_matcher(pattern)
    assert all(match(ip) for ip in yes) and not any(match(ip) for ip in no)


def test_permission_rules_are_rocketmqs():
    from rmqlab.broker.plain_acl import ANY, DENY, PUB, SUB, check_permission, parse_perm

    assert [parse_perm(t) for t in ("PUB", "SUB", "PUB|SUB", "SUB|PUB", "DENY", "pub", None)] == [
        PUB, SUB, PUB | SUB, PUB | SUB, DENY, DENY, DENY,
    ]  # fmt: skip
    assert check_permission(PUB, PUB | SUB) and not check_permission(PUB, SUB)
    assert not check_permission(SUB, SUB | DENY)
    assert check_permission(ANY, SUB) and not check_permission(ANY, DENY)


def test_resources_a_request_needs():
    from rmqlab.broker.plain_acl import PUB, SUB, needed_resources

    def need(code, ext=None, body=None):
        return needed_resources(RemotingCommand.request(code, ext, body))

    assert need(RequestCode.SEND_MESSAGE, {"topic": "T"}) == {"T": PUB}
    assert need(RequestCode.SEND_MESSAGE, {"topic": "%RETRY%g"}) == {"%RETRY%null": SUB}  # as RocketMQ
    assert need(RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "g"}) == {"T": SUB, "%RETRY%g": SUB}
    hb = {"consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [{"topic": "T"}, {"topic": "U"}]}]}
    assert need(RequestCode.HEART_BEAT, body=hb) == {"%RETRY%g": SUB, "T": SUB, "U": SUB}
    assert need(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "T"}) == {
        "%RETRY%g": SUB,
        "T": SUB,
    }
    assert need(RequestCode.GET_MAX_OFFSET, {"topic": "T"}) == {}
    pop = {"consumerGroup": "g", "topic": "T", "queueId": 0}
    assert need(RequestCode.POP_MESSAGE, pop) == {"%RETRY%g": SUB, "T": SUB}
    assert need(RequestCode.ACK_MESSAGE, pop | {"topic": "%RETRY%g_T"}) == {
        "%RETRY%g": SUB,
        "%RETRY%g_T": SUB,
    }
    assert need(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {"topic": "T"}) == {"T": SUB}  # absent: skipped
    for code in (
        RequestCode.BATCH_ACK_MESSAGE,
        RequestCode.QUERY_ASSIGNMENT,
        RequestCode.SET_MESSAGE_REQUEST_MODE,
    ):
        assert need(code, body={"consumerGroup": "g", "topic": "T", "acks": [{"c": "g", "t": "T"}]}) == {}


POP_ACL = """\
accounts:
  - accessKey: popper1
    secretKey: secret-p1
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - T=PUB|SUB
    groupPerms:
      - closed=DENY
      - g_T=DENY
"""
POPPER = SessionCredentials("popper1", "secret-p1")


def _pop_ext(group: str = "g", topic: str = "T", queue_id: int = 0, invisible: int = 300) -> dict:
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue_id,
        "maxMsgNums": 32,
        "invisibleTime": invisible,
        "pollTime": 0,
        "bornTime": int(time.time() * 1000),
        "initMode": 0,
    }


def _signed_native_frame(
    code: int, opaque: int, ext: dict[str, str], credentials: SessionCredentials
) -> bytes:
    """What AclClientRPCHook puts on a native request: the key, then the signature over every other
    header field (json_frame adds an empty OnsChannel, as the C++ client does) in key order."""
    fields = {"OnsChannel": "", **ext, "AccessKey": credentials.access_key}
    signature = cal_signature(combine_request_content(fields, b""), credentials.secret_key)
    return json_frame(code, opaque, fields | {"Signature": signature})


async def test_pop_codes_need_sub_on_group_and_topic_on_both_ports(make_broker, make_peer, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(POP_ACL)
    broker = await make_broker(time_scale=0.01, acl_file=str(path))
    p = Signed(broker.address, POPPER)
    try:
        await p.heartbeat("c1", group="g", topics=["T"])
        for body in (b"a", b"b"):
            assert (await p.send("T", body=body)).code == ResponseCode.SUCCESS
        popped = await p.call(RequestCode.POP_MESSAGE, _pop_ext())
        assert popped.code == ResponseCode.SUCCESS, popped.remark
        first, _ = (ExtraInfo.parse(m["properties"][PROPERTY_POP_CK]) for m in popped.body["messages"])

        def ack_ext(r: ExtraInfo, group: str = "g", topic: str = "T") -> dict:
            return {
                "consumerGroup": group,
                "topic": topic,
                "queueId": r.queue_id,
                "extraInfo": r.build(),
                "offset": r.queue_offset,
            }

        refusals = [
            (RequestCode.POP_MESSAGE, _pop_ext(group="closed"), "group:closed"),
            (RequestCode.POP_MESSAGE, _pop_ext(topic="Other"), "topic:Other"),
            (RequestCode.ACK_MESSAGE, ack_ext(first, group="closed"), "group:closed"),
            (
                RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
                ack_ext(first, topic="Other") | {"invisibleTime": 1000},
                "topic:Other",
            ),
        ]
        for code, ext, what in refusals:
            resp = await p.call(code, ext)
            assert resp.code == ResponseCode.NO_PERMISSION, (code, resp.code, resp.remark)
            assert resp.remark == f"No default permission for {what}"
        assert broker.pop_state.in_flight() == 2  # nothing was acked or changed by the refused requests
        assert (await p.call(RequestCode.ACK_MESSAGE, ack_ext(first))).code == ResponseCode.SUCCESS
        # The unacked one is revived into %RETRY%g_T; acking it there names that topic, a group to the ACL.
        await wait_until(lambda: broker.pop_state.in_flight() == 0, within=5)
        back = await p.call(RequestCode.POP_MESSAGE, _pop_ext(queue_id=-1, invisible=60_000))
        assert back.code == ResponseCode.SUCCESS and [m["body"] for m in back.body["messages"]] == [b"b"]
        revived = ExtraInfo.parse(back.body["messages"][0]["properties"][PROPERTY_POP_CK])
        assert revived.retry == "1" and revived.queue_offset == 0  # the first message of %RETRY%g_T
        resp = await p.call(RequestCode.ACK_MESSAGE, ack_ext(revived, topic="%RETRY%g_T"))
        assert (
            resp.code == ResponseCode.NO_PERMISSION and resp.remark == "No default permission for group:g_T"
        )
        # RocketMQ 5 checks no resource of the body-only codes: a signature is enough, whatever the group.
        query = {"topic": "T", "consumerGroup": "closed", "clientId": "c1", "strategyName": "AVG"}
        assert (await p.call(RequestCode.QUERY_ASSIGNMENT, body=query)).code == ResponseCode.SUCCESS
        mode = {"topic": "T", "consumerGroup": "closed", "mode": "PULL", "popShareQueueNum": 0}
        assert (await p.call(RequestCode.SET_MESSAGE_REQUEST_MODE, body=mode)).code == ResponseCode.SUCCESS
        batch = {"acks": [{"c": "closed", "t": "T", "r": "0", "so": 0, "q": 0, "rq": 0, "pt": 1, "b": [0]}]}
        assert (await p.call(RequestCode.BATCH_ACK_MESSAGE, body=batch)).code == ResponseCode.SUCCESS
        # The native port: the same rule for a header as Apache's clients sign it.
        await broker.start_native_port(0)
        n = await NativePeer.connect(broker.native_server.port)
        try:
            ext = {k: str(v) for k, v in _pop_ext(group="closed").items()}
            await n.send(_signed_native_frame(RequestCode.POP_MESSAGE, 1, ext, POPPER))
            r = await n.recv()
            assert (
                r.code == ResponseCode.NO_PERMISSION and r.remark == "No default permission for group:closed"
            )
            assert (await p.send("T", body=b"c")).code == ResponseCode.SUCCESS
            ext = {k: str(v) for k, v in _pop_ext().items()}
            await n.send(_signed_native_frame(RequestCode.POP_MESSAGE, 2, ext, POPPER))
            r = await n.recv()
            assert r.code == ResponseCode.SUCCESS, (r.code, r.remark)
            assert [m.body for m in decode_messages(r.body)] == [b"c"]
        finally:
            await n.close()
    finally:
        await p.close()
    unsigned = make_peer(broker.address)
    resp = await unsigned.call(RequestCode.POP_MESSAGE, _pop_ext())
    assert resp.code == ResponseCode.NO_PERMISSION and resp.remark == "No accessKey is configured"
