package rmqlab.interop.remoting;

import java.util.List;
import java.util.Set;
import java.util.function.Supplier;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.store.LocalFileOffsetStore;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore;
import org.apache.rocketmq.client.impl.MQClientManager;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import rmqlab.interop.common.EventLog;
import rmqlab.interop.common.ListenerGate;

/**
 * DefaultLitePullConsumer in subscribe mode (kind java-lite): the client rebalances and pulls, one thread
 * here polls and consumes; offsets are auto-committed by the client. Its queues are recorded from the
 * MessageQueueListener it calls after it has updated its assigned queues.
 */
final class LiteDriver implements Driver {
    private static final long POLL_MS = 1_000;

    private final Settings s;
    private final Recorder recorder;
    private final Consumed consumed;
    private DefaultLitePullConsumer consumer;
    private RecordingOffsetStore store;
    private StartOffsets starts;
    private Thread poller;
    private volatile boolean stopping;

    LiteDriver(Settings s, EventLog events, ListenerGate gate) {
        this.s = s;
        this.recorder = new Recorder(events, s.group);
        this.consumed = new Consumed(events, s.group, recorder::clientId, s.mode(), s.consumeMs, gate);
    }

    @Override
    public String start() throws Exception {
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(s.group);
        consumer = c;
        poller = null;
        c.setNamesrvAddr(s.namesrv);
        if (s.instance != null) {
            c.setInstanceName(s.instance);
        }
        c.setMessageModel(ClientVersion.messageModel(s.broadcast));
        c.setConsumeFromWhere(ClientInfo.consumeFromWhere(s));
        if (s.consumeTimestamp != null) {
            c.setConsumeTimestamp(s.consumeTimestamp);
        }
        c.setPullThreadNums(s.threads);
        c.setAutoCommit(true);
        c.setAllocateMessageQueueStrategy(new RecordingStrategy(Strategies.create(s.strategy, s), recorder));
        // The client instance of this consumer's client id: made by start() before it loads the store.
        Supplier<MQClientInstance> factory = () -> MQClientManager.getInstance().getOrCreateMQClientInstance(c);
        Supplier<OffsetStore> ownStore = () -> s.broadcast
            ? new LocalFileOffsetStore(factory.get(), s.group)
            : new RemoteBrokerOffsetStore(factory.get(), s.group);
        starts = new StartOffsets(factory, c::getConsumeFromWhere, c::getConsumeTimestamp);
        store = ClientVersion.offsetStore(ownStore, this::loaded, recorder, starts, false,
            s.broadcast ? "local" : "broker");
        c.setOffsetStore(store);
        Timers.apply(c, s.timeScale);
        c.subscribe(s.topic, s.expression, this::queuesChanged);
        c.start();
        poller = new Thread(this::pollLoop, "lab-poll");
        poller.start();
        return c.buildMQClientId();
    }

    private void loaded() {
        recorder.started(consumer.buildMQClientId(), "java-" + ClientInfo.version(), s.kind, s.topic);
    }

    /** The client's MessageQueueListener: it has just updated its assigned queues to these. */
    private void queuesChanged(String topic, Set<MessageQueue> mqAll, Set<MessageQueue> mqDivided) {
        Set<MessageQueue> mine = s.broadcast ? mqAll : mqDivided;
        if (s.broadcast) {
            recorder.broadcastRebalanced(topic, mqAll);
        }
        for (MessageQueue mq : recorder.owned(topic)) {
            if (!mine.contains(mq)) {
                recorder.removed(mq, "reallocated");
            }
        }
        for (MessageQueue mq : Recorder.sorted(mine)) {
            if (!recorder.owns(mq)) {
                recorder.added(mq, starts.resolve(mq, store.lastRead(mq)));
            }
        }
    }

    private void pollLoop() {
        while (!stopping) {
            List<MessageExt> msgs;
            try {
                msgs = consumer.poll(POLL_MS);
            } catch (RuntimeException e) {
                if (stopping) {
                    return;
                }
                System.err.println("poll failed: " + e);
                continue;
            }
            try {
                for (MessageExt msg : msgs) {
                    long started = consumed.begin();
                    consumed.work();
                    consumed.done(msg, null, started);
                }
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    @Override
    public void stop() {
        stopping = true;
        if (consumer != null && poller != null) {
            consumer.shutdown();
        } else if (consumer != null) {
            // start() failed; its client instance, if it made one, is the one of its client id.
            ClientInfo.releaseFailedStart(MQClientManager.getInstance().getOrCreateMQClientInstance(consumer), s.group);
        }
        if (poller != null) {
            poller.interrupt();
            try {
                poller.join(2_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        recorder.stopped();
    }
}
