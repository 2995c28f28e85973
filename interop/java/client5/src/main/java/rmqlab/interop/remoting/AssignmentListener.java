package rmqlab.interop.remoting;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Set;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageQueueListener;
import org.apache.rocketmq.client.impl.consumer.RebalanceImpl;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * The push consumer's MessageQueueListener (5.2 and later call it whenever a rebalance changed its queues).
 * For a topic the broker assigns, it writes the answer as the client now holds it: {@code assignment} with
 * the PULL queues (its process queues) and the POP ones (its pop process queues), and {@code pop_mq_added} /
 * {@code pop_mq_removed}; the PULL queues' {@code mq_added} / {@code mq_removed} come from the offset store
 * as for any push consumer. For a broadcasting consumer it writes the round as a {@code rebalance}.
 */
final class AssignmentListener implements MessageQueueListener {
    private final DefaultMQPushConsumer consumer;
    private final Settings s;
    private final Recorder recorder;

    AssignmentListener(DefaultMQPushConsumer consumer, Settings s, Recorder recorder) {
        this.consumer = consumer;
        this.s = s;
        this.recorder = recorder;
    }

    @Override
    public void messageQueueChanged(String topic, Set<MessageQueue> mqAll, Set<MessageQueue> mqDivided) {
        if (s.broadcast) {
            recorder.broadcastRebalanced(topic, mqDivided);
            return;
        }
        RebalanceImpl rebalance = consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl();
        if (rebalance.clientRebalance(topic)) {
            return; // allocated by the strategy: already written as a rebalance
        }
        recorder.assignment(topic, consumer.getAllocateMessageQueueStrategy().getName(),
            ofTopic(rebalance.getProcessQueueTable().keySet(), topic),
            ofTopic(rebalance.getPopProcessQueueTable().keySet(), topic));
    }

    private static List<MessageQueue> ofTopic(Collection<MessageQueue> mqs, String topic) {
        List<MessageQueue> out = new ArrayList<>();
        for (MessageQueue mq : mqs) {
            if (mq.getTopic().equals(topic)) {
                out.add(mq);
            }
        }
        return out;
    }
}
