"""The catalogue of RocketMQ's known rebalancing problems, each reproduced by a shipped experiment.

An entry names the problem's reports, the releases it affects and the one that fixed it, the question it
answers, the ``summary.json`` figure that shows it, and two variants: ``affected`` (the behaviour before
the fix) and ``fixed``. A variant is a set of ``ConsumerConfig`` switches given to every consumer of ours
(``client_version`` selects the switches of that release, see ``client.versions``: it becomes the
``client_version`` key of every ``[[consumers]]`` table) and of broker behaviour flags (the ``[policies]``
keys, such as ``init_pop_offset_by_check_msg_in_mem``). The scenario is
the experiment file ``lab/known/NAME.toml`` (without ``name`` and ``question``, which come from here):
this module is the one place the list, the docs and the tests read.

Pure: no processes and no clock; ``experiment_text`` gives the text a backend runs.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rmqlab.cli import KNOWN_VARIANTS, Shelf, UnknownName
from rmqlab.lab.experiment import Experiment

KNOWN = Shelf("rmqlab.lab", "known", "lab/known")
PREFIX = "known/"
VARIANTS = KNOWN_VARIANTS
DEFAULT_VARIANT = VARIANTS[0]
# Where an entry runs and what it needs (the --json list's ``needs``).
NEEDS = ("sim", "processes", "containers", "java", "go", "cpp")


@dataclass(frozen=True)
class Variant:
    """One behaviour of an entry: the consumer switches, and what the lab shows with them."""

    settings: Mapping[str, Any]
    expect: str
    # the scenario file (a stem on the known shelf) when it is not the entry's own: a problem no release
    # fixed is shown next to its remedy
    scenario: str = ""
    # the brokers' behaviour flags ([policies] keys) that go with the variant
    policies: Mapping[str, Any] = field(default_factory=dict)

    def consumer_settings(self) -> dict[str, Any]:
        """What every consumer of ours is given (ConsumerConfig settings; ``client_version`` included)."""
        return dict(self.settings)

    @property
    def client_version(self) -> str | None:
        version = self.settings.get("client_version")
        return None if version is None else str(version)

    def named_settings(self) -> dict[str, Any]:
        """The switches named one by one (the consumer tables carry ``client_version``)."""
        return {k: v for k, v in self.settings.items() if k != "client_version"}


@dataclass(frozen=True)
class KnownProblem:
    """A catalogue entry."""

    name: str
    issues: tuple[str, ...]  # "apache/rocketmq#2621"
    affected: str  # the releases that show it
    fixed_in: str
    question: str
    figure: str  # a summary.json group field, dotted for nested ones
    change: str  # the source change the affected variant undoes
    variants: Mapping[str, Variant]
    needs: tuple[str, ...] = ("sim", "processes")
    # the problem shows when the figure is above this (its unit: the field's)
    above: float = 0
    unit: str = ""
    # for a problem no release fixed: what avoids it (the fixed variant runs it)
    remedy: str = ""

    def variant(self, name: str) -> Variant:
        if name not in self.variants:
            raise UnknownName(
                f"known/{self.name} has no variant {name!r} (variants: {', '.join(self.variants)})"
            )
        return self.variants[name]

    def shows(self, value: float) -> bool:
        return value > self.above

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "issues": list(self.issues),
            "affected": self.affected,
            "fixed_in": self.fixed_in,
            "question": self.question,
            "figure": self.figure,
            "shows_above": self.above,
            "change": self.change,
            "remedy": self.remedy or None,
            "needs": list(self.needs),
            "command": f"rmq-sim run {PREFIX}{self.name} --variant affected|fixed"
            + (
                f"; rmq-chaos run {PREFIX}{self.name} --variant affected|fixed"
                if "processes" in self.needs
                else ""
            ),
            "variants": {
                name: {"settings": dict(v.settings), "policies": dict(v.policies), "expect": v.expect}
                for name, v in self.variants.items()
            },
        }

    def manifest(self, variant: str) -> dict[str, Any]:
        """What a run of the entry records in manifest.json, for the report's first sentence."""
        return {
            "name": self.name,
            "variant": variant,
            "issues": list(self.issues),
            "affected": self.affected,
            "fixed_in": self.fixed_in,
            "figure": self.figure,
            "shows_above": self.above,
            "unit": self.unit,
            "change": self.change,
            **({"remedy": self.remedy} if self.remedy else {}),
        }


CATALOGUE: tuple[KnownProblem, ...] = (
    KnownProblem(
        name="orderly-new-queue-waits-for-lock",
        issues=("apache/rocketmq#2621", "apache/rocketmq#5465"),
        affected="4.9.4 and earlier",
        fixed_in="4.9.5",
        question="Does an orderly consumer leave a queue it was just given idle until its next lockAll?",
        figure="unavailability.by_cause_rocketmq_ms.owner_idle",
        unit="ms of RocketMQ time",
        change="RebalanceImpl.updateProcessQueueTableInRebalance creates the new ProcessQueue locked",
        variants={
            "affected": Variant(
                {"client_version": "4.9.4"},
                "the queues taken over wait, locked at the broker but not in the client, for the next "
                "lockAll (up to 20 s): owner_idle > 0",
            ),
            "fixed": Variant(
                {"client_version": "4.9.5"}, "the queues taken over are pulled at once: owner_idle = 0"
            ),
        },
    ),
    KnownProblem(
        name="offset-query-error-skips-backlog",
        issues=(),
        affected="4.9.8 and earlier",
        fixed_in="5.0.0",
        question="When the broker answers a consumer's offset query with an error, does the new owner of "
        "a queue skip its backlog?",
        figure="lost",
        unit="messages",
        change="RemoteBrokerOffsetStore.readOffset takes only OffsetNotFoundException for 'no offset', "
        "commit b6ff649291; before, any broker error did",
        variants={
            "affected": Variant(
                {"query_offset_error_as_not_found": True},
                "the take-over starts at the queues' max offset: the backlog is never consumed (lost > 0)",
            ),
            "fixed": Variant(
                {"query_offset_error_as_not_found": False},
                "the queue is skipped until the query succeeds, then starts from the committed offset: "
                "lost = 0",
            ),
        },
    ),
    KnownProblem(
        name="reconnect-waits-for-heartbeat",
        issues=("apache/rocketmq#7296", "apache/rocketmq#7323"),
        affected="5.1.4 and earlier (4.9.x included)",
        fixed_in="5.2.0",
        question="After a consumer's connection to the broker is reset, how long do two consumers own the "
        "same queues before its next heartbeat?",
        figure="rocketmq_time.overlap_ms",
        above=10_000,
        unit="ms of RocketMQ time",
        change="MQClientInstance sends a heartbeat when a broker connection opens, "
        "enableHeartbeatChannelEventListener, PR #7324",
        variants={
            "affected": Variant(
                {"heartbeat_on_connect": False},
                "both consumers own the reset consumer's queues until its next 30 s heartbeat: "
                "overlap above 10 s of RocketMQ time (summed over queues), duplicates",
            ),
            "fixed": Variant(
                {"heartbeat_on_connect": True},
                "the reconnected consumer registers at once: the overlap is the reconnection itself, "
                "below 10 s summed over the 4 queues",
            ),
        },
    ),
    KnownProblem(
        name="orderly-lock-failure-waits-a-round",
        issues=(),
        affected="4.9.8 and earlier",
        fixed_in="5.0.0",
        question="When an orderly consumer cannot lock a queue it was given (another member still holds "
        "it), does the queue wait for the next 20 s rebalance?",
        figure="unavailability.by_cause_rocketmq_ms.lock_wait",
        unit="ms of RocketMQ time",
        change="RebalanceImpl.updateProcessQueueTableInRebalance calls rebalanceLater(500) when a lock "
        "failed, commit 9d8f4c2cc0, RIP-19",
        variants={
            "affected": Variant(
                {"rebalance_later_on_lock_failure": False},
                "while the group forms, queues whose lock failed wait up to 20 s for the next round: "
                "lock_wait > 0",
            ),
            "fixed": Variant(
                {"rebalance_later_on_lock_failure": True},
                "a failed lock is tried again 500 ms later, once its holder let it go: lock_wait = 0",
            ),
        },
        # the simulator starts the four consumers at one instant; processes start one after another, and
        # in the run made with them no lock failed at start (0 ms with both variants)
        needs=("sim",),
    ),
    KnownProblem(
        name="duplicate-client-id-in-docker",
        issues=("apache/rocketmq#667", "apache/rocketmq#2760"),
        affected="4.8.0 and earlier",
        fixed_in="4.9.0",
        question="Two consumers in containers with host networking: do they get one client id, and "
        "which queues does nobody consume?",
        figure="lost",
        unit="messages",
        change="ClientConfig.changeInstanceNameToPID makes the instance name pid#nanoTime instead of the pid",
        variants={
            "affected": Variant(
                {"instance_name_with_nano_time": False},
                "both consumers are HOST_IP@1: both take the first half of the queues (duplicates) and "
                "the second half is never consumed (lost > 0)",
            ),
            "fixed": Variant(
                {"instance_name_with_nano_time": True},
                "the ids differ (1#nanoTime), the queues are shared: lost = 0, no duplicates",
            ),
        },
        # the simulator models the containers; with processes it would need containers on host networking
        needs=("sim",),
    ),
    KnownProblem(
        name="different-subscriptions-in-one-group",
        issues=(
            "apache/rocketmq#1873",
            "apache/rocketmq#2089",
            "apache/rocketmq#2836",
            "apache/rocketmq#5473",
        ),
        affected="every release (4.x and 5.x)",
        fixed_in="not fixed",
        remedy="one consumer group per subscription",
        question="What goes wrong when the consumers of one group subscribe to different topics?",
        figure="lost",
        unit="messages",
        change="ConsumerGroupInfo.updateSubscription keeps one subscription table per group, rewritten "
        "by each member's heartbeat; each member divides a topic's queues among every member",
        variants={
            "affected": Variant(
                {},
                "queues of each topic go to members that do not subscribe to it, and pulls meet "
                "SUBSCRIPTION_NOT_EXIST as the table flips: lost > 0",
            ),
            "fixed": Variant(
                {},
                "each topic's consumers form a group of their own: lost = 0",
                scenario="different-subscriptions-one-group-each",
            ),
        },
    ),
    KnownProblem(
        name="offset-query-error-waits-a-round",
        issues=("apache/rocketmq#7644",),
        affected="5.0.0 to 5.1.4",
        fixed_in="5.2.0",
        question="When a new queue's start offset cannot be read, does it wait for the next 20 s rebalance?",
        figure="unavailability.by_cause_rocketmq_ms.lock_wait",
        above=20_000,
        unit="ms of RocketMQ time",
        change="RebalanceService runs a round again after 1 s while the last one left the client "
        "unbalanced, commit 59e8f9b66e",
        variants={
            "affected": Variant(
                {"query_offset_error_as_not_found": False, "rebalance_retry_when_unbalanced": False},
                "the queues whose offset query failed stay untaken until the next round: "
                "allocated-but-not-taken time above 20 s summed over the queues",
            ),
            "fixed": Variant(
                {"query_offset_error_as_not_found": False, "rebalance_retry_when_unbalanced": True},
                "they are taken within a second of the broker answering again: below 20 s",
            ),
        },
    ),
    KnownProblem(
        name="orderly-killed-owner-holds-lock",
        issues=(),
        affected="every release (4.x and 5.x)",
        fixed_in="not fixed",
        remedy="stop consumers gracefully (shutdown unlocks their queues) instead of killing them",
        question="When an orderly consumer is killed, how long do its queues wait for the broker locks it "
        "still holds?",
        figure="unavailability.by_cause_rocketmq_ms.lock_wait",
        unit="ms of RocketMQ time",
        change="RebalanceLockManager keeps a client's queue locks until they expire (60 s after its last "
        "lockAll, rocketmq.broker.rebalance.lockMaxLiveTime) also when its connection closes; only "
        "UNLOCK_BATCH_MQ, which DefaultMQPushConsumerImpl.shutdown sends, frees them at once",
        variants={
            # today's client on both sides, so that failed locks of a forming group
            # (orderly-lock-failure-waits-a-round, fixed in 5.0.0) do not mix in
            "affected": Variant(
                {"client_version": "5.3.3"},
                "the killed consumer's queues are given to the others at once but their locks fail "
                "until the broker lets the old ones expire: lock_wait > 0",
            ),
            "fixed": Variant(
                {"client_version": "5.3.3"},
                "the consumer stopped gracefully unlocks its queues and the others lock them at once: "
                "lock_wait = 0",
                scenario="orderly-stopped-owner-unlocks",
            ),
        },
    ),
    KnownProblem(
        name="offset-illegal-waits-a-round",
        issues=("apache/rocketmq#7644",),
        affected="5.1.4 and earlier (4.9.x included)",
        fixed_in="5.2.0",
        question="When a broker comes back without its store and answers pulls with OFFSET_MOVED, how "
        "long do the consumers leave its queues?",
        figure="unavailability.by_cause_rocketmq_ms.lock_wait",
        above=10_000,
        unit="ms of RocketMQ time",
        change="DefaultMQPushConsumerImpl.pullMessage, case OFFSET_ILLEGAL: the offset is fixed at once and "
        "the rebalance woken (ISSUE #7644); before, the queue was dropped, its offset fixed 10 s later "
        "(executeTaskLater) and the queue taken again at the next 20 s rebalance",
        variants={
            "affected": Variant(
                {"offset_illegal_5x": False},
                "every queue is dropped and taken again at the client's next rebalance: allocated but "
                "not taken for more than 10 s summed over the queues",
            ),
            "fixed": Variant(
                {"offset_illegal_5x": True},
                "the queues are pulled again from the corrected offset at once: below 10 s",
            ),
        },
    ),
    KnownProblem(
        name="mixed-allocation-strategies-in-one-group",
        issues=(),
        affected="every release (4.x and 5.x)",
        fixed_in="not fixed",
        remedy="one allocation strategy for every member of a group",
        question="What goes wrong when the members of one group divide the queues by different "
        "allocation strategies?",
        figure="lost",
        unit="messages",
        change="RebalanceImpl.rebalanceByTopic: each client computes only its own share, with its own "
        "AllocateMessageQueueStrategy; nothing checks that the members of a group use the same one (the "
        "mechanism of apache/rocketmq-client-go#419, where Go's averaging differed from Java's)",
        variants={
            "affected": Variant(
                {},
                "half the members allocate averagely, half by circle: some queues are taken twice "
                "(duplicates) and others by nobody (lost > 0)",
            ),
            "fixed": Variant(
                {},
                "every member allocates averagely: lost = 0, no duplicates",
                scenario="mixed-allocation-strategies-aligned",
            ),
        },
    ),
    KnownProblem(
        name="pop-and-pull-members-in-one-group",
        issues=(),
        affected="every release with POP (5.x)",
        fixed_in="not fixed",
        remedy="move every member of a group to POP at once, or give the POP consumers a group of their own",
        question="When part of a consumer group pops (RocketMQ 5, broker-side assignment) and the rest "
        "still balances in the client and pulls, which messages are consumed twice?",
        figure="duplicates",
        unit="messages",
        change="RebalanceImpl.doRebalance: a client with clientRebalance = true (every 4.x client) divides "
        "the queues among all members by itself, while the broker's POP assignment "
        "(QueryAssignmentProcessor.allocate4Pop, popShareQueueNum -1) gives every popping member every "
        "queue; a member that falls back to its own rebalance while the others pop is how "
        "apache/rocketmq#8686 duplicates",
        variants={
            "affected": Variant(
                {},
                "the queues the pulling members hold are also popped by the others: duplicates > 0",
            ),
            "fixed": Variant(
                {},
                "every member pops: no duplicates",
                scenario="pop-and-pull-members-moved-together",
            ),
        },
    ),
    KnownProblem(
        name="pop-max-start-skips-new-broker",
        issues=("apache/rocketmq#7117",),
        affected="5.0.0 to 5.1.3 (broker)",
        fixed_in="5.1.4",
        question="When a broker joins the cluster, do POP consumers that start from the max offset skip "
        "what the producers sent to its queues before they first popped there?",
        figure="lost",
        unit="messages",
        change="PopMessageProcessor.getInitOffset starts a queue the group has no offset for at 0 while it "
        "still holds its first message (BrokerConfig.initPopOffsetByCheckMsgInMem, PR #7118, commit "
        "04683ec058); before, a MAX start began at the queue's last message",
        variants={
            "affected": Variant(
                {},
                "the new broker's queues start at their last message at the group's first POP: what was "
                "sent there before is never consumed (lost > 0)",
                policies={"init_pop_offset_by_check_msg_in_mem": False},
            ),
            "fixed": Variant(
                {},
                "the new broker's queues still hold their first message and start at 0: lost = 0",
                policies={"init_pop_offset_by_check_msg_in_mem": True},
            ),
        },
    ),
    KnownProblem(
        name="pop-query-assignment-timeout-falls-back",
        issues=("apache/rocketmq#8686", "apache/rocketmq#8957"),
        affected="5.0.0 to 5.3.1",
        fixed_in="5.3.2",
        question="When a POP consumer's first QUERY_ASSIGNMENT times out (network jitter), does it balance "
        "the topic by itself for good, and which messages are consumed twice?",
        figure="duplicates",
        unit="messages",
        change="RebalanceImpl.doRebalance asks the broker whenever clientRebalance is false; "
        "tryQueryAssignment, which gave the topic to the client's own allocation for good after three "
        "timeouts, is gone (PR #8958, commit d63373a152)",
        variants={
            "affected": Variant(
                {"client_version": "5.3.1"},
                "the consumer that joined during the jitter pulls its share of the queues while the others "
                "pop them all: duplicates > 0",
            ),
            "fixed": Variant(
                {"client_version": "5.3.2"},
                "it asks the broker again at each rebalance and pops with the others once the answers "
                "come back: no duplicates",
            ),
        },
    ),
    KnownProblem(
        name="read-only-broker-idles-a-consumer",
        issues=("apache/rocketmq#3465",),
        affected="every release (4.x and 5.x)",
        fixed_in="not fixed",
        remedy="a strategy that spreads each broker's queues over the members, such as "
        "AllocateMessageQueueAveragelyByCircle",
        question="When a broker is read only (brokerPermission 4, for maintenance), does a consumer of the "
        "group get only its queues and nothing to consume?",
        figure="consumers_without_messages",
        change="TopicRouteData: producers send to the writable queues only (TopicPublishInfo), while "
        "RebalanceImpl.rebalanceByTopic divides every readable queue among the members; "
        "AllocateMessageQueueAveragely gives each member a run of consecutive queues, which can be all "
        "of the read-only broker's",
        variants={
            "affected": Variant(
                {},
                "the last member's run of queues is the read-only broker's: it consumes nothing "
                "(consumers_without_messages = 1)",
            ),
            "fixed": Variant(
                {},
                "allocated by circle, every member holds writable queues: consumers_without_messages = 0",
                scenario="read-only-broker-by-circle",
            ),
        },
    ),
)


def entries() -> dict[str, KnownProblem]:
    return {e.name: e for e in CATALOGUE}


def is_known(path_or_name: str) -> bool:
    return path_or_name.startswith(PREFIX)


def find(path_or_name: str) -> KnownProblem:
    """The entry ``known/NAME`` (or ``NAME``) names; UnknownName listing the entries otherwise."""
    name = path_or_name.removeprefix(PREFIX).removesuffix(".toml")
    found = entries()
    if name in found:
        return found[name]
    close = difflib.get_close_matches(name, list(found), n=2, cutoff=0.5)
    hint = f"; did you mean {' or '.join(PREFIX + c for c in close)}?" if close else ""
    raise UnknownName(
        f"no known problem named {name!r}{hint} (the catalogue: "
        f"{', '.join(PREFIX + n for n in sorted(found))})"
    )


def scenario_text(entry: KnownProblem, variant: str = DEFAULT_VARIANT) -> str:
    """The experiment file a variant of the entry runs, as shipped."""
    stem = entry.variant(variant).scenario or entry.name
    shelf = KNOWN.entries()
    if stem not in shelf:
        raise UnknownName(f"{KNOWN.label}/{stem}.toml is missing from the installed package")
    return str(shelf[stem].read_text(encoding="utf-8"))


def scenario_files() -> set[str]:
    """The stems of every scenario the catalogue runs."""
    return {v.scenario or e.name for e in CATALOGUE for v in e.variants.values()}


def experiment_text(entry: KnownProblem, variant: str, *, sim: bool) -> str:
    """The experiment a backend runs: the name and question from the catalogue, the scenario with the
    variant's ``client_version`` in every ``[[consumers]]`` table and its broker flags as ``[policies]``,
    and for the simulator the switches it names one by one as a ``[sim.client]`` table (so that the run
    directory's copy replays the same variant; processes get those as ``rmq-consumer --set``)."""
    v = entry.variant(variant)
    head = f"name = {json.dumps(entry.name)}\nquestion = {json.dumps(entry.question)}\n"
    text = head + scenario_text(entry, variant)
    if v.client_version is not None:
        line = f"client_version = {_toml_value(v.client_version)}  # known/{entry.name}, variant {variant}"
        text = "\n".join(
            f"{row}\n{line}" if row.strip() == "[[consumers]]" else row for row in text.split("\n")
        )
    if v.policies:
        text = text.rstrip("\n") + f"\n\n[policies]  # known/{entry.name}, variant {variant}\n"
        text += "".join(f"{key} = {_toml_value(value)}\n" for key, value in sorted(v.policies.items()))
    # the simulator checks the settings as it checks any [sim.client] table; rmq-consumer its --set
    settings = v.named_settings()
    if sim and settings:
        lines = [f"{key} = {_toml_value(value)}" for key, value in sorted(settings.items())]
        text = text.rstrip("\n") + f"\n\n[sim.client]  # known/{entry.name}, variant {variant}\n"
        text += "\n".join(lines) + "\n"
    return text


def for_processes(entry: KnownProblem, variant: str, exp: Experiment) -> Experiment:
    """The parsed scenario ``exp`` (``experiment_text``'s, with ``sim=False``) with the switches the
    variant names one by one given to every consumer of ours (the processes get them as
    ``rmq-consumer --set``)."""
    settings = tuple(sorted(entry.variant(variant).named_settings().items()))
    return replace(exp, consumers=tuple(replace(c, settings=settings) for c in exp.consumers))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def scenario_keys(text: str) -> set[str]:
    """The top-level keys of a scenario file (the tests check it leaves name and question to here)."""
    return set(tomllib.loads(text))
