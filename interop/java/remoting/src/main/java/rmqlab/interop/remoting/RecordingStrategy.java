package rmqlab.interop.remoting;

import java.util.List;
import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The strategy the client is given: the configured one, asked exactly as the client asks it, with every
 * answer recorded as a {@code rebalance} event (the client's own sorted member and queue lists, and what it
 * got). Its name is the configured one's, which a 5.x client also sends with QUERY_ASSIGNMENT.
 */
final class RecordingStrategy implements AllocateMessageQueueStrategy {
    private final AllocateMessageQueueStrategy inner;
    private final Recorder recorder;

    RecordingStrategy(AllocateMessageQueueStrategy inner, Recorder recorder) {
        this.inner = inner;
        this.recorder = recorder;
    }

    @Override
    public List<MessageQueue> allocate(String consumerGroup, String currentCID, List<MessageQueue> mqAll,
        List<String> cidAll) {
        // The client catches what the strategy throws, logs it and skips the round: so does this.
        List<MessageQueue> result = inner.allocate(consumerGroup, currentCID, mqAll, cidAll);
        if (mqAll != null && !mqAll.isEmpty()) {
            recorder.rebalanced(mqAll.get(0).getTopic(), getName(), currentCID, cidAll, mqAll,
                result == null ? List.of() : result);
        }
        return result;
    }

    @Override
    public String getName() {
        return inner.getName();
    }
}
