package rmqlab.interop.remoting;

import java.util.function.Supplier;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.common.message.MessageQueue;

/** The recording store with 5.x's updateAndFreezeOffset (a reset offset the client must not move back). */
final class FreezingOffsetStore extends RecordingOffsetStore {
    FreezingOffsetStore(Supplier<OffsetStore> create, Runnable onLoad, Recorder recorder, StartOffsets starts,
        boolean queueEvents, String storeName) {
        super(create, onLoad, recorder, starts, queueEvents, storeName);
    }

    @Override
    public void updateAndFreezeOffset(MessageQueue mq, long offset) {
        delegate.updateAndFreezeOffset(mq, offset);
    }
}
