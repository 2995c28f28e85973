package rmqlab.interop.grpc;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.java.impl.ClientImpl;
import org.apache.rocketmq.client.java.message.MessageViewImpl;
import org.apache.rocketmq.client.java.misc.MetadataUtils;
import rmqlab.interop.common.EventLog;
import rmqlab.interop.common.Flags;
import rmqlab.interop.common.Flags.UsageError;
import rmqlab.interop.common.Lifecycle;
import rmqlab.interop.common.ListenerGate;

/**
 * The lab's driver for Apache's v5 gRPC Java client (rocketmq-client-java): a PushConsumer through
 * rmq-proxy (kind java-grpc). The proxy assigns (POP, by message), so the client has no allocation and no
 * offsets of its own to hook; the driver writes {@code consumer_started}, {@code message_consumed} from its
 * MessageListener (the queue and offset read from the message's receipt handle, as the proxy's broker wrote
 * it), and {@code consumer_stopped}. Prints {@code READY <client id>} once started; SIGTERM or SIGINT close
 * it gracefully; SIGUSR1 hangs the listener and SIGUSR2 releases it.
 */
public final class Main {
    private static final String KIND = "java-grpc";

    private Main() {
    }

    static Flags flags() {
        return new Flags("consumer.sh --kind java-grpc --endpoints HOST:PORT --group G --topic T [options]")
            .option("--kind", "KIND", KIND, "java-grpc (the only kind of this client)")
            .option("--endpoints", "HOST:PORT", null, "rmq-proxy's gRPC address")
            .option("--group", "G", null, "consumer group")
            .option("--topic", "T", null, "topic to subscribe")
            .option("--expression", "EXPR", "*", "tag expression (e.g. 'TagA || TagB')")
            .alias("--tags", "--expression")
            .option("--consume-ms", "MS", "0", "time the listener takes per message")
            .option("--threads", "N", "4", "consumption threads")
            .option("--time-scale", "X", "1", "accepted for the lab's other kinds: this client's timers are fixed")
            .option("--node", "NAME", null, "node name in events (default java-grpc-<pid>)")
            .option("--log-file", "PATH", null, "events file (JSON lines); stderr when absent")
            .option("--client-log-dir", "DIR", null, "folder the client writes its own log to")
            .toggle("--help", "print this help");
    }

    public static void main(String[] args) throws Exception {
        Flags f = flags();
        String endpoints;
        String group;
        String topic;
        int consumeMs;
        int threads;
        try {
            f.parse(args);
            if (f.isSet("--help")) {
                System.out.print(f.usage());
                return;
            }
            if (!KIND.equals(f.get("--kind"))) {
                throw new UsageError("--kind " + f.get("--kind") + " is not the gRPC client's (java-grpc)");
            }
            endpoints = f.require("--endpoints");
            group = f.require("--group");
            topic = f.require("--topic");
            consumeMs = f.getInt("--consume-ms", 0);
            threads = f.getInt("--threads", 1);
            f.getPositiveDouble("--time-scale");
        } catch (UsageError e) {
            System.err.println("consumer: " + e.getMessage());
            System.err.print(f.usage());
            System.exit(2);
            return;
        }
        if (f.get("--client-log-dir") != null) {
            System.setProperty("rocketmq.log.root", f.get("--client-log-dir"));
        }
        String node = f.get("--node") != null ? f.get("--node") : KIND + "-" + ProcessHandle.current().pid();
        EventLog events = new EventLog(node, "consumer", f.get("--log-file"));
        ListenerGate gate = new ListenerGate(events, group);
        gate.install();
        Listener listener = new Listener(events, group, consumeMs, gate);

        PushConsumer[] consumer = new PushConsumer[1];
        Lifecycle.onStop(() -> {
            if (consumer[0] != null) {
                try {
                    consumer[0].close();
                } catch (Exception e) {
                    System.err.println("consumer: close failed: " + e);
                }
                events.emit("consumer_stopped", "group", group, "client_id", listener.clientId);
            }
            events.close();
        });
        ClientConfiguration config = ClientConfiguration.newBuilder()
            .setEndpoints(endpoints)
            .enableSsl(false) // rmq-proxy serves plain gRPC
            .build();
        try {
            consumer[0] = ClientServiceProvider.loadService().newPushConsumerBuilder()
                .setClientConfiguration(config)
                .setConsumerGroup(group)
                .setSubscriptionExpressions(Collections.singletonMap(topic,
                    new FilterExpression(f.get("--expression"), FilterExpressionType.TAG)))
                .setConsumptionThreadCount(threads)
                .setMessageListener(listener::consume)
                .build();
        } catch (Exception e) {
            System.err.println("consumer: could not start: " + e);
            System.exit(1);
            return;
        }
        String clientId = ((ClientImpl) consumer[0]).getClientId().toString();
        listener.clientId = clientId;
        events.emit("consumer_started", "group", group, "client_id", clientId,
            "client", "java-grpc-" + MetadataUtils.getVersion(), "kind", KIND, "topic", topic);
        Lifecycle.ready(clientId);
        Lifecycle.awaitSignal();
    }

    /** The MessageListener: gate, work, and {@code message_consumed} as it returns SUCCESS. */
    static final class Listener {
        private final EventLog events;
        private final String group;
        private final int consumeMs;
        private final ListenerGate gate;
        volatile String clientId = "";

        Listener(EventLog events, String group, int consumeMs, ListenerGate gate) {
            this.events = events;
            this.group = group;
            this.consumeMs = consumeMs;
            this.gate = gate;
        }

        ConsumeResult consume(MessageView message) {
            long started;
            try {
                gate.pass();
                started = System.currentTimeMillis();
                if (consumeMs > 0) {
                    Thread.sleep(consumeMs);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return ConsumeResult.FAILURE;
            }
            String topic = message.getTopic();
            String broker = "";
            int queueId = -1;
            long offset = -1;
            if (message instanceof MessageViewImpl) {
                MessageViewImpl impl = (MessageViewImpl) message;
                offset = impl.getOffset();
                if (impl.getMessageQueue() != null) {
                    broker = impl.getMessageQueue().getBroker().getName();
                    queueId = impl.getMessageQueue().getQueueId();
                }
                // ckOffset popTime invisibleTime reviveQid retry brokerName queueId offset: the copy popped
                // (retry 1: it lies in the pop retry topic).
                String receipt = impl.getReceiptHandle();
                String[] parts = receipt == null ? new String[0] : receipt.split(" ");
                if (parts.length >= 8) {
                    topic = "1".equals(parts[4]) ? "%RETRY%" + group + "_" + topic : topic;
                    broker = parts[5];
                    queueId = Integer.parseInt(parts[6]);
                    offset = Long.parseLong(parts[7]);
                }
            }
            ByteBuffer body = message.getBody();
            byte[] bytes = new byte[Math.min(body.remaining(), 200)];
            body.duplicate().get(bytes);
            events.emit("message_consumed", "group", group, "client_id", clientId,
                "msg_id", message.getMessageId().toString(), "topic", topic, "broker", broker, "queue_id", queueId,
                "queue_offset", offset, "started_ms", started, "mode", "CONCURRENTLY",
                "reconsume_times", Math.max(0, message.getDeliveryAttempt() - 1),
                "body", new String(bytes, StandardCharsets.UTF_8));
            return ConsumeResult.SUCCESS;
        }
    }
}
