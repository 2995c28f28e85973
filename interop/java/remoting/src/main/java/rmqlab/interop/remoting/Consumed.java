package rmqlab.interop.remoting;

import java.nio.charset.StandardCharsets;
import java.util.function.Supplier;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import rmqlab.interop.common.EventLog;
import rmqlab.interop.common.ListenerGate;

/**
 * The listener's side: the hung-listener gate, the simulated work, and a {@code message_consumed} line per
 * message once the listener is about to return success ({@code ts_ms}), with {@code started_ms} when it was
 * called. The queue is the one the client consumed from (a retried message's is its retry queue); a message
 * a 5.x client popped names the queue of the copy it got, from its POP_CK checkpoint.
 */
final class Consumed {
    private static final String PROPERTY_POP_CK = "POP_CK";
    private static final String PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID";

    private final EventLog events;
    private final String group;
    private final Supplier<String> clientId;
    private final String mode;
    private final int consumeMs;
    private final ListenerGate gate;

    Consumed(EventLog events, String group, Supplier<String> clientId, String mode, int consumeMs,
        ListenerGate gate) {
        this.events = events;
        this.group = group;
        this.clientId = clientId;
        this.mode = mode;
        this.consumeMs = consumeMs;
        this.gate = gate;
    }

    /** Waits at the gate, then returns the time the work on the message starts. */
    long begin() throws InterruptedException {
        gate.pass();
        return System.currentTimeMillis();
    }

    void work() throws InterruptedException {
        if (consumeMs > 0) {
            Thread.sleep(consumeMs);
        }
    }

    /** {@code mq} is the queue the client says the message came from (null: the message's own fields). */
    void done(MessageExt msg, MessageQueue mq, long startedMs) {
        String topic = mq != null ? mq.getTopic() : msg.getTopic();
        String broker = mq != null ? mq.getBrokerName() : msg.getBrokerName();
        int queueId = msg.getQueueId();
        String checkpoint = msg.getProperty(PROPERTY_POP_CK);
        if (checkpoint != null) {
            // ckOffset popTime invisibleTime reviveQid retry brokerName queueId offset: retry 1 means the copy
            // lies in the pop retry topic.
            String[] parts = checkpoint.split(" ");
            if (parts.length >= 7) {
                topic = "1".equals(parts[4]) ? "%RETRY%" + group + "_" + msg.getTopic() : msg.getTopic();
                broker = parts[5];
                queueId = Integer.parseInt(parts[6]);
            }
        }
        String origin = msg.getProperty(PROPERTY_ORIGIN_MESSAGE_ID);
        byte[] body = msg.getBody() == null ? new byte[0] : msg.getBody();
        String text = new String(body, StandardCharsets.UTF_8);
        events.emit("message_consumed", "group", group, "client_id", clientId.get(),
            "msg_id", origin != null ? origin : msg.getMsgId(), "topic", topic, "broker", broker,
            "queue_id", queueId, "queue_offset", msg.getQueueOffset(), "started_ms", startedMs, "mode", mode,
            "reconsume_times", msg.getReconsumeTimes(), "body", text.length() > 200 ? text.substring(0, 200) : text);
    }
}
