package rmqlab.interop.remoting;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.common.message.MessageQueue;
import rmqlab.interop.common.EventLog;

/**
 * The consumer's EVENTS.md lines about its group and queues, called from the client's hooks: what the
 * strategy allocated ({@code rebalance}, {@code topic_route}), the queues the client took and gave up
 * ({@code mq_added}, {@code mq_removed}), what it committed, and the server-side assignment of a 5.x
 * client ({@code assignment}, {@code pop_mq_added}, {@code pop_mq_removed}).
 */
final class Recorder {
    private final EventLog events;
    private final String group;
    private volatile String clientId = "";
    private final Map<String, List<String>> routes = new ConcurrentHashMap<>();
    private final Map<String, Set<MessageQueue>> allocations = new ConcurrentHashMap<>();
    private final Set<MessageQueue> owned = ConcurrentHashMap.newKeySet();
    private final Set<MessageQueue> popOwned = ConcurrentHashMap.newKeySet();
    private final Map<MessageQueue, Long> committed = new ConcurrentHashMap<>();
    private final Map<String, List<List<String>>> assignments = new ConcurrentHashMap<>();

    Recorder(EventLog events, String group) {
        this.events = events;
        this.group = group;
    }

    String clientId() {
        return clientId;
    }

    void started(String clientId, String client, String kind, String topic) {
        this.clientId = clientId;
        events.emit("consumer_started", "group", group, "client_id", clientId, "client", client, "kind", kind,
            "topic", topic);
    }

    void stopped() {
        if (clientId.isEmpty()) {
            return; // stopped before it started
        }
        for (MessageQueue mq : new ArrayList<>(owned)) {
            removed(mq, "shutdown");
        }
        for (MessageQueue mq : new ArrayList<>(popOwned)) {
            popRemoved(mq, "shutdown");
        }
        events.emit("consumer_stopped", "group", group, "client_id", clientId);
        clientId = "";
    }

    /** One allocation the strategy made: {@code rebalance}, after {@code topic_route} when the queues changed. */
    void rebalanced(String topic, String strategy, String currentCid, List<String> cidAll,
        Collection<MessageQueue> mqAll, Collection<MessageQueue> allocated) {
        route(topic, mqAll);
        Set<MessageQueue> now = new HashSet<>(allocated);
        Set<MessageQueue> before = allocations.put(topic, now);
        boolean changed = !now.equals(before == null ? Collections.emptySet() : before);
        events.emit("rebalance", "group", group, "client_id", currentCid, "topic", topic, "strategy", strategy,
            "cid_all", new ArrayList<>(cidAll), "mq_all", shorts(sorted(mqAll)), "allocated", shorts(allocated),
            "changed", changed);
    }

    /** A BROADCASTING round: every queue of the topic is this client's; no strategy is asked. */
    void broadcastRebalanced(String topic, Collection<MessageQueue> mqAll) {
        rebalanced(topic, "BROADCASTING", clientId, Collections.singletonList(clientId), mqAll, sorted(mqAll));
    }

    void route(String topic, Collection<MessageQueue> mqAll) {
        List<String> queues = shorts(sorted(mqAll));
        if (!queues.equals(routes.put(topic, queues))) {
            events.emit("topic_route", "group", group, "client_id", clientId, "topic", topic, "queues", queues);
        }
    }

    /** The latest allocation of the topic (empty before the first). */
    Set<MessageQueue> allocation(String topic) {
        return allocations.getOrDefault(topic, Collections.emptySet());
    }

    boolean owns(MessageQueue mq) {
        return owned.contains(mq);
    }

    Set<MessageQueue> owned(String topic) {
        Set<MessageQueue> out = new HashSet<>();
        for (MessageQueue mq : owned) {
            if (mq.getTopic().equals(topic)) {
                out.add(mq);
            }
        }
        return out;
    }

    void added(MessageQueue mq, long nextOffset) {
        if (owned.add(mq)) {
            queueEvent("mq_added", mq, "next_offset", nextOffset);
        }
    }

    void removed(MessageQueue mq, String reason) {
        if (owned.remove(mq)) {
            queueEvent("mq_removed", mq, "reason", reason);
        }
    }

    /** An offset the client sent to the broker (or wrote to its local file): written when it moved. */
    void committed(MessageQueue mq, long offset, String store) {
        if (offset >= 0) {
            Long before = committed.put(mq, offset);
            if (before == null || before != offset) {
                queueEvent("offset_committed", mq, "offset", offset, "store", store);
            }
        }
    }

    /** The broker's answer to this client (server-side assignment), written when it changed. */
    void assignment(String topic, String strategy, Collection<MessageQueue> pull, Collection<MessageQueue> pop) {
        List<String> pullShort = shorts(sorted(pull));
        List<String> popShort = shorts(sorted(pop));
        List<List<String>> answer = List.of(pullShort, popShort);
        boolean changed = !answer.equals(assignments.put(topic, answer));
        events.emit("assignment", "group", group, "client_id", clientId, "topic", topic, "strategy", strategy,
            "pull", pullShort, "pop", popShort, "changed", changed);
        Set<MessageQueue> popNow = new HashSet<>(pop);
        for (MessageQueue mq : new ArrayList<>(popOwned)) {
            if (mq.getTopic().equals(topic) && !popNow.contains(mq)) {
                popRemoved(mq, "reallocated");
            }
        }
        for (MessageQueue mq : sorted(pop)) {
            if (popOwned.add(mq)) {
                queueEvent("pop_mq_added", mq);
            }
        }
    }

    private void popRemoved(MessageQueue mq, String reason) {
        if (popOwned.remove(mq)) {
            queueEvent("pop_mq_removed", mq, "reason", reason);
        }
    }

    private void queueEvent(String event, MessageQueue mq, Object... more) {
        Object[] fields = new Object[10 + more.length];
        Object[] head = {"group", group, "client_id", clientId, "topic", mq.getTopic(), "broker", mq.getBrokerName(),
            "queue_id", mq.getQueueId()};
        System.arraycopy(head, 0, fields, 0, head.length);
        System.arraycopy(more, 0, fields, head.length, more.length);
        events.emit(event, fields);
    }

    static List<MessageQueue> sorted(Collection<MessageQueue> mqs) {
        return new ArrayList<>(new TreeSet<>(mqs == null ? Collections.<MessageQueue>emptySet() : mqs));
    }

    static String shortName(MessageQueue mq) {
        return mq.getBrokerName() + ":" + mq.getQueueId();
    }

    static List<String> shorts(Collection<MessageQueue> mqs) {
        List<String> out = new ArrayList<>();
        for (MessageQueue mq : mqs) {
            out.add(shortName(mq));
        }
        return out;
    }
}
