"""ConsumerManager / ConsumerGroupInfo: PROTOCOL.md "Membership" rules, without sockets."""

from __future__ import annotations

from rmqlab.broker.consumer_manager import ClientChannelInfo, ConsumerManager, ProducerManager
from rmqlab.protocol.model import ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData

G = "g1"


def chan(conn_id: int, client_id: str, now: int = 0) -> ClientChannelInfo:
    return ClientChannelInfo(conn_id, client_id, f"127.0.0.1:{1000 + conn_id}", now, 1_700_000_000_000 + now)


def sub(topic: str, version: int = 1, expr: str = "*") -> SubscriptionData:
    return SubscriptionData.build(topic, expr, version)


def register(cm: ConsumerManager, conn_id: int, client_id: str, subs: list[SubscriptionData], now: int = 0):
    return cm.register_consumer(
        G,
        chan(conn_id, client_id, now),
        ConsumeType.CONSUME_PASSIVELY,
        MessageModel.CLUSTERING,
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        subs,
    )


def test_first_registration_is_a_change_and_refresh_is_not():
    cm = ConsumerManager()
    r = register(cm, 1, "c1", [sub("T")])
    assert r.changed and r.new_channel and r.topics_changed
    r = register(cm, 1, "c1", [sub("T")], now=5)
    assert not r.changed and not r.new_channel
    assert cm.find(G).channels[1].last_update_ms == 5
    r = register(cm, 2, "c2", [sub("T")])
    assert r.changed and r.new_channel and not r.topics_changed
    assert cm.find(G).all_client_ids() == ["c1", "c2"]


def test_latest_heartbeat_overwrites_topic_set():
    cm = ConsumerManager()
    register(cm, 1, "c1", [sub("A"), sub("B")])
    r = register(cm, 2, "c2", [sub("A")])
    assert r.changed and r.topics_changed  # B removed
    assert set(cm.find(G).subscription_table) == {"A"}
    r = register(cm, 1, "c1", [sub("A"), sub("B")])
    assert r.changed and set(cm.find(G).subscription_table) == {"A", "B"}


def test_newer_sub_version_replaces_without_change_and_older_is_ignored():
    cm = ConsumerManager()
    register(cm, 1, "c1", [sub("A", 10, "x")])
    r = register(cm, 1, "c1", [sub("A", 20, "y")])
    assert not r.changed
    assert cm.find(G).find_subscription("A").sub_string == "y"
    register(cm, 1, "c1", [sub("A", 15, "z")])
    assert cm.find(G).find_subscription("A").sub_version == 20


def test_inconsistent_subscriptions_are_reported_between_live_members_only():
    cm = ConsumerManager()
    assert register(cm, 1, "c1", [sub("A")]).inconsistency is None
    r = register(cm, 2, "c2", [sub("B")])
    inc = r.inconsistency
    assert inc is not None and inc.client_id == "c2"
    assert inc.topics == ["B"] and inc.previous_topics == ["A"]
    assert (inc.other_client_id, inc.other_topics) == ("c1", ["A"])
    # every flip is reported while they disagree; a repeat that changes nothing is not
    assert register(cm, 1, "c1", [sub("A")]).inconsistency.other_client_id == "c2"
    assert register(cm, 1, "c1", [sub("A")]).inconsistency is None
    # once c1 left, c2 changing its own subscription is not an inconsistency
    cm.unregister_consumer(G, 1)
    assert register(cm, 2, "c2", [sub("C")]).inconsistency is None


def test_connection_reregistering_with_other_client_id_replaces_without_change():
    cm = ConsumerManager()
    register(cm, 1, "c1", [sub("A")])
    r = register(cm, 1, "c9", [sub("A")])
    assert not r.changed and r.replaced_client_id == "c1"
    assert cm.find(G).all_client_ids() == ["c9"]


def test_unregister_and_close_remove_by_connection_and_drop_empty_groups():
    cm = ConsumerManager()
    register(cm, 1, "c1", [sub("A")])
    register(cm, 2, "c2", [sub("A")])
    assert cm.unregister_consumer(G, 3) is None
    assert cm.unregister_consumer(G, 1).client_id == "c1"
    assert cm.conn_ids(G) == [2]
    removed = cm.do_channel_close_event(2)
    assert [(g, i.client_id) for g, i in removed] == [(G, "c2")]
    assert cm.find(G) is None
    assert cm.do_channel_close_event(2) == []


def test_expiry_scan_removes_only_stale_registrations():
    cm = ConsumerManager()
    register(cm, 1, "c1", [sub("A")], now=0)
    register(cm, 2, "c2", [sub("A")], now=0)
    register(cm, 2, "c2", [sub("A")], now=100_000)  # refreshed
    assert cm.scan_not_active_channel(120_000, 120_000) == []  # not strictly older
    expired = cm.scan_not_active_channel(120_001, 120_000)
    assert [i.client_id for _, i in expired] == ["c1"]
    assert cm.find(G).all_client_ids() == ["c2"]
    expired = cm.scan_not_active_channel(300_000, 120_000)
    assert [i.client_id for _, i in expired] == ["c2"] and cm.find(G) is None


def test_group_settings_follow_latest_heartbeat():
    cm = ConsumerManager()
    register(cm, 1, "c1", [sub("A")])
    cm.register_consumer(
        G,
        chan(2, "c2"),
        ConsumeType.CONSUME_ACTIVELY,
        MessageModel.BROADCASTING,
        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        [sub("A")],
    )
    gi = cm.find(G)
    assert gi.message_model is MessageModel.BROADCASTING
    assert gi.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


def test_producer_manager():
    pm = ProducerManager()
    assert pm.register_producer("p", chan(1, "x"))
    assert not pm.register_producer("p", chan(1, "x"))
    assert pm.unregister_producer("p", 1)
    assert not pm.unregister_producer("p", 1)
    pm.register_producer("p", chan(2, "y", now=0))
    assert [i.client_id for _, i in pm.scan_not_active_channel(10, 5)] == ["y"]


def test_the_kept_client_id_list_follows_every_channel_change():
    # GET_CONSUMER_LIST_BY_GROUP answers from a list kept between changes: each way the channel table
    # changes (join, a connection re-registering under another id, leave, expiry) must show in it
    cm = ConsumerManager()
    register(cm, 1, "c1", [sub("T")])
    register(cm, 2, "c2", [sub("T")])
    gi = cm.find(G)
    first = gi.client_ids()
    assert first == ("c1", "c2") and gi.client_ids() is first  # kept while nothing changes
    register(cm, 2, "c2", [sub("T")], now=5)  # a heartbeat refresh is not a change
    assert gi.client_ids() is first
    register(cm, 2, "c9", [sub("T")], now=6)
    assert gi.client_ids() == ("c1", "c9")
    register(cm, 3, "c3", [sub("T")], now=7)
    assert gi.client_ids() == ("c1", "c9", "c3")
    cm.unregister_consumer(G, 1)
    assert gi.client_ids() == ("c9", "c3")
    register(cm, 3, "c3", [sub("T")], now=100)
    expired = cm.scan_not_active_channel(now_ms=110, channel_expired_timeout_ms=50)
    assert [info.client_id for _, info in expired] == ["c9"]
    assert gi.client_ids() == ("c3",) and gi.all_client_ids() == ["c3"]
