package rmqlab.interop.remoting;

import java.util.List;
import java.util.function.Supplier;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;

/** What differs in rocketmq-client 4.x: its kinds, its package names, nothing assigned by the broker. */
final class ClientVersion {
    static final List<String> KINDS = List.of("java", "java-lite");

    private ClientVersion() {
    }

    static MessageModel messageModel(boolean broadcast) {
        return broadcast ? MessageModel.BROADCASTING : MessageModel.CLUSTERING;
    }

    static RecordingOffsetStore offsetStore(Supplier<OffsetStore> create, Runnable onLoad, Recorder recorder,
        StartOffsets starts, boolean queueEvents, String storeName) {
        // 4.x's OffsetStore has no method beyond the shared ones.
        return new RecordingOffsetStore(create, onLoad, recorder, starts, queueEvents, storeName) { };
    }

    /** A 4.x push consumer always allocates its queues itself: nothing to add. */
    static void configurePush(DefaultMQPushConsumer consumer, Settings s, Recorder recorder) {
    }
}
