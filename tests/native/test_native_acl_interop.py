"""Apache's C++ client against a broker with ``--acl``: with its session credentials set it produces
and consumes; without them it is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.interop import Lab, consumed_positions, cpp_client_missing, max_offsets, wait_for

pytestmark = pytest.mark.slow

_cpp_missing = cpp_client_missing()
needs_cpp = pytest.mark.skipif(_cpp_missing is not None, reason=_cpp_missing or "")

ACL = """\
accounts:
  - accessKey: cppclient
    secretKey: cpp-secret
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
"""
KEYS = ("--access-key", "cppclient", "--secret-key", "cpp-secret")


@pytest.fixture
def lab(tmp_path: Path):
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


@needs_cpp
def test_cpp_client_with_credentials_works_and_without_is_refused(lab: Lab, tmp_path: Path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    group, topic = "GA", "TA"
    lab.start_broker([topic], 4, "--acl", str(acl))

    # Without credentials: every send is refused, and so is the consumer's heartbeat.
    assert lab.cpp_producer("cpp-stranger", topic, 3, "x").popen.wait(60) != 0
    assert lab.events("cpp-stranger", "send_failed") and not lab.events("cpp-stranger", "message_sent")
    stranger = lab.cpp_consumer("cpp-anon", group, topic)
    stranger.wait_ready()
    wait_for(
        "the unsigned consumer's heartbeat refused",
        lambda: [e for e in lab.events("broker-a", "request_refused") if e["request_code"] == 34],
        20,
        lab,
    )
    stranger.stop()
    assert not lab.events("broker-a", "consumer_registered")

    # With them: produce and consume.
    assert lab.cpp_producer("cpp-producer", topic, 12, "acl", *KEYS).popen.wait(60) == 0
    sent = max_offsets(lab, topic)
    positions = {(q, o) for q, top in sent.items() for o in range(top)}
    assert len(positions) == 12
    lab.cpp_consumer("cpp-acl", group, topic, *KEYS).wait_ready()
    wait_for("all 12 consumed", lambda: positions <= set(consumed_positions(lab, group, topic)), 40, lab)
