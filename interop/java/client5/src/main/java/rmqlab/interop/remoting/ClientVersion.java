package rmqlab.interop.remoting;

import java.util.List;
import java.util.function.Supplier;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;

/**
 * What differs in rocketmq-client 5.x: its kinds, its package names, the offset store's extra method, and
 * the broker's part in the rebalance. A java5 push consumer follows the broker (clientRebalance false):
 * each round asks QUERY_ASSIGNMENT, and takes its queues in the mode the broker answers with (PULL, or POP
 * when the broker was told so for the group); an orderly or broadcasting one still allocates itself.
 */
final class ClientVersion {
    static final List<String> KINDS = List.of("java5");

    private ClientVersion() {
    }

    static MessageModel messageModel(boolean broadcast) {
        return broadcast ? MessageModel.BROADCASTING : MessageModel.CLUSTERING;
    }

    static RecordingOffsetStore offsetStore(Supplier<OffsetStore> create, Runnable onLoad, Recorder recorder,
        StartOffsets starts, boolean queueEvents, String storeName) {
        return new FreezingOffsetStore(create, onLoad, recorder, starts, queueEvents, storeName);
    }

    static void configurePush(DefaultMQPushConsumer consumer, Settings s, Recorder recorder) {
        // How long a popped message stays invisible (the client refuses less than 5 s, more than 300 s).
        consumer.setPopInvisibleTime(Math.min(300_000, Math.max(5_000, Timers.scaled(60_000, s.timeScale))));
        consumer.setClientRebalance(false);
        consumer.setMessageQueueListener(new AssignmentListener(consumer, s, recorder));
    }
}
