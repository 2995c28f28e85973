"""The seed scenario: consumers of one group subscribing to different topics.

Each client allocates a topic among every client of the group, subscribers or not, so part of each topic
is allocated to a client that never pulls it; and every heartbeat rewrites the group's subscription table
on the broker, so pulls of the other topic fail with SUBSCRIPTION_NOT_EXIST until the next heartbeat.
"""

from __future__ import annotations

import pytest
from kit import wait_until
from kit.cluster import Cluster


@pytest.fixture
async def cluster(tmp_path):  # type: ignore[no-untyped-def]
    c = Cluster(str(tmp_path))
    yield c
    await c.close()


async def test_consumers_of_one_group_with_different_topics(cluster: Cluster) -> None:
    await cluster.start_broker()
    await cluster.create_topic("TopicA", 4)
    await cluster.create_topic("TopicB", 4)
    consumed: dict[str, set[str]] = {"TopicA": set(), "TopicB": set()}
    clients = {}
    for topic in ("TopicA", "TopicB"):
        c = cluster.consumer("seed", f"consumer-{topic}", consume_from_where="first")
        c.subscribe(topic)
        c.register_message_listener(lambda msgs, _t=topic: consumed[_t].update(m.msg_id for m in msgs))
        clients[topic] = c
        await c.start()
    ids = sorted(c.client_id for c in clients.values())

    def last_rebalance(c, topic: str) -> dict | None:  # type: ignore[no-untyped-def, type-arg]
        mine = [
            e for e in cluster.events("rebalance") if e["client_id"] == c.client_id and e["topic"] == topic
        ]
        return mine[-1] if mine else None

    def both_counted() -> bool:  # each client's last rebalance counts the non-subscriber too
        return all(
            (r := last_rebalance(c, t)) is not None and sorted(r["cid_all"]) == ids
            for t, c in clients.items()
        )

    # The first client owns all of its topic until a rebalance counts the second one (the broker's
    # notification or the next round): what is sent before then may be consumed from any queue. The
    # scenario is the steady state, so produce once both clients' rebalances count both members.
    await wait_until(both_counted, 30, "a rebalance of each client counting both members")
    producer = cluster.producer()
    await producer.start()
    sent = {t: [await producer.send(t, b"%s-%d" % (t.encode(), i)) for i in range(24)] for t in clients}

    def failed_with(code: str) -> list[dict]:  # type: ignore[type-arg]
        return [e for e in cluster.events("pull_failed") if e["code"] == code]

    await wait_until(lambda: bool(failed_with("SUBSCRIPTION_NOT_EXIST")), 10, "SUBSCRIPTION_NOT_EXIST pulls")
    last_sent_ms = max(e["ts_ms"] for e in cluster.events("message_sent"))

    def pulled_since_sent() -> bool:  # every queue a client owns was pulled once every message was stored
        answered = {
            (e["client_id"], e["topic"], f"{e['broker']}:{e['queue_id']}")
            for e in cluster.events()
            if e["event"] in ("pull_served", "pull_failed") and e["ts_ms"] > last_sent_ms
        }
        return all(
            (c.client_id, t, q) in answered
            for t, c in clients.items()
            for q in (last_rebalance(c, t) or {"allocated": []})["allocated"]
        )

    # Whether a client's own pulls succeed depends on whose heartbeat came last (the two may even keep
    # heartbeating a millisecond apart, and one of them never consume): wait for pull rounds on every owned
    # queue after the sends, served or refused, then check that what nobody owns stayed where it was.
    await wait_until(pulled_since_sent, 30, "a pull of every owned queue after the sends", step=0.1)

    for topic, c in clients.items():
        last = last_rebalance(c, topic)
        assert last is not None and sorted(last["cid_all"]) == ids
        share = set(last["allocated"])
        assert len(share) == 2  # half of the topic: the other half went to a client that never pulls it
        on_share = {r.msg_id for r in sent[topic] if f"{r.broker_name}:{r.queue_id}" in share}
        elsewhere = {r.msg_id for r in sent[topic]} - on_share
        assert elsewhere and not (elsewhere & consumed[topic])  # stuck: nobody consumes them
        assert consumed[topic] <= on_share
    # the broker saw one group's heartbeats carry different topic sets and said so
    assert cluster.events("subscription_inconsistent")
    failures = failed_with("SUBSCRIPTION_NOT_EXIST")
    assert {e["topic"] for e in failures} & {"TopicA", "TopicB"}
