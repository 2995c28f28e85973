package rmqlab.interop.remoting;

import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Supplier;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.ReadOffsetType;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.exception.RemotingException;

/**
 * The offset store the client is given: the one it would make itself (made in {@link #load()}, which the
 * client calls from start() once its client instance exists), with every call passed on, and recorded:
 *
 * <ul>
 *   <li>{@code load()}: the client is starting, its client id fixed: {@code consumer_started};
 *   <li>{@code persist}/{@code persistAll}: the offsets sent to the broker (or the local file):
 *       {@code offset_committed} with the offset the store held, when it moved;
 *   <li>a push consumer's {@code readOffset(mq, READ_FROM_STORE)} for a queue it does not own: the client
 *       is adding the queue (computePullFromWhere; an orderly client has locked it): {@code mq_added};
 *   <li>{@code removeOffset(mq)} right after {@code persist(mq)} on the same thread: the client is giving
 *       the queue up (removeUnnecessaryMessageQueue): {@code mq_removed}. A {@code removeOffset} without
 *       it is the dirty-offset cleanup before an add, and says nothing. The reason is offset_moved when the
 *       same thread has just set the queue's offset outright (OFFSET_ILLEGAL, a reset), pull_expired when
 *       the queue is still allocated to the client, else reallocated.
 * </ul>
 */
abstract class RecordingOffsetStore implements OffsetStore {
    private final Supplier<OffsetStore> create;
    private final Runnable onLoad;
    private final Recorder recorder;
    private final StartOffsets starts;
    private final boolean queueEvents;
    private final String storeName;
    private final Map<MessageQueue, Long> lastRead = new ConcurrentHashMap<>();
    private final ThreadLocal<MessageQueue> justPersisted = new ThreadLocal<>();
    private final ThreadLocal<MessageQueue> offsetMoved = new ThreadLocal<>();
    protected volatile OffsetStore delegate;

    /**
     * @param queueEvents whether this store's calls mark queues added and removed (a push consumer's do; a
     *     lite pull consumer's queues are recorded from its MessageQueueListener instead)
     * @param storeName "broker" (RemoteBrokerOffsetStore) or "local" (LocalFileOffsetStore, broadcasting)
     */
    RecordingOffsetStore(Supplier<OffsetStore> create, Runnable onLoad, Recorder recorder, StartOffsets starts,
        boolean queueEvents, String storeName) {
        this.create = create;
        this.onLoad = onLoad;
        this.recorder = recorder;
        this.starts = starts;
        this.queueEvents = queueEvents;
        this.storeName = storeName;
    }

    /** The offset this store last read for {@code mq} from the broker or file (-1 when none). */
    long lastRead(MessageQueue mq) {
        return lastRead.getOrDefault(mq, -1L);
    }

    @Override
    public void load() throws MQClientException {
        delegate = create.get();
        delegate.load();
        onLoad.run();
    }

    @Override
    public void updateOffset(MessageQueue mq, long offset, boolean increaseOnly) {
        delegate.updateOffset(mq, offset, increaseOnly);
        if (!increaseOnly) {
            // The offset set outright: after OFFSET_ILLEGAL or a reset the client drops the queue next.
            offsetMoved.set(mq);
        }
    }

    @Override
    public long readOffset(MessageQueue mq, ReadOffsetType type) {
        long offset = delegate.readOffset(mq, type);
        if (mq != null && type != ReadOffsetType.READ_FROM_MEMORY) {
            lastRead.put(mq, offset);
            if (queueEvents && type == ReadOffsetType.READ_FROM_STORE && !recorder.owns(mq)) {
                long next = starts.resolve(mq, offset);
                if (next >= 0) {
                    recorder.added(mq, next);
                }
            }
        }
        return offset;
    }

    @Override
    public void persistAll(Set<MessageQueue> mqs) {
        Map<MessageQueue, Long> held = new HashMap<>();
        for (MessageQueue mq : mqs) {
            held.put(mq, delegate.readOffset(mq, ReadOffsetType.READ_FROM_MEMORY));
        }
        delegate.persistAll(mqs);
        for (Map.Entry<MessageQueue, Long> e : held.entrySet()) {
            recorder.committed(e.getKey(), e.getValue(), storeName);
        }
    }

    @Override
    public void persist(MessageQueue mq) {
        justPersisted.set(mq);
        long held = delegate.readOffset(mq, ReadOffsetType.READ_FROM_MEMORY);
        delegate.persist(mq);
        recorder.committed(mq, held, storeName);
    }

    @Override
    public void removeOffset(MessageQueue mq) {
        delegate.removeOffset(mq);
        boolean givingUp = mq != null && mq.equals(justPersisted.get());
        boolean moved = mq != null && mq.equals(offsetMoved.get());
        justPersisted.remove();
        offsetMoved.remove();
        lastRead.remove(mq);
        if (queueEvents && givingUp) {
            String reason = "reallocated";
            if (moved) {
                reason = "offset_moved";
            } else if (recorder.allocation(mq.getTopic()).contains(mq)) {
                reason = "pull_expired"; // still allocated: dropped because its pulls stopped
            }
            recorder.removed(mq, reason);
        }
    }

    @Override
    public Map<MessageQueue, Long> cloneOffsetTable(String topic) {
        return delegate.cloneOffsetTable(topic);
    }

    @Override
    public void updateConsumeOffsetToBroker(MessageQueue mq, long offset, boolean isOneway)
        throws RemotingException, MQBrokerException, InterruptedException, MQClientException {
        delegate.updateConsumeOffsetToBroker(mq, offset, isOneway);
        recorder.committed(mq, offset, storeName);
    }
}
