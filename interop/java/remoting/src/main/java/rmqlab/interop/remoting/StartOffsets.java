package rmqlab.interop.remoting;

import java.util.function.Supplier;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.UtilAll;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The offset a new queue is pulled from, as the client computes it (computePullFromWhereWithException)
 * from the offset its store read: that offset when there is one; otherwise 0 for a retry topic or
 * CONSUME_FROM_FIRST_OFFSET, and the broker's max offset (or the offset at the consume timestamp), asked
 * again here, for the others. -1 when that question fails: the client's fails too, and it skips the queue.
 */
final class StartOffsets {
    private final Supplier<MQClientInstance> factory;
    private final Supplier<ConsumeFromWhere> where;
    private final Supplier<String> timestamp;

    StartOffsets(Supplier<MQClientInstance> factory, Supplier<ConsumeFromWhere> where, Supplier<String> timestamp) {
        this.factory = factory;
        this.where = where;
        this.timestamp = timestamp;
    }

    long resolve(MessageQueue mq, long stored) {
        if (stored >= 0) {
            return stored;
        }
        if (stored != -1) {
            return -1;
        }
        boolean retry = mq.getTopic().startsWith(MixAll.RETRY_GROUP_TOPIC_PREFIX);
        try {
            switch (where.get()) {
                case CONSUME_FROM_FIRST_OFFSET:
                    return 0;
                case CONSUME_FROM_TIMESTAMP:
                    if (retry) {
                        return factory.get().getMQAdminImpl().maxOffset(mq);
                    }
                    long at = UtilAll.parseDate(timestamp.get(), UtilAll.YYYYMMDDHHMMSS).getTime();
                    return factory.get().getMQAdminImpl().searchOffset(mq, at);
                default:
                    return retry ? 0 : factory.get().getMQAdminImpl().maxOffset(mq);
            }
        } catch (Exception e) {
            return -1;
        }
    }
}
