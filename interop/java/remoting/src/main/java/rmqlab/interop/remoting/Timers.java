package rmqlab.interop.remoting;

import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.rocketmq.client.ClientConfig;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;

/**
 * {@code --time-scale X}: the client's timers that can be set from outside, times X. Most are JVM system
 * properties the client reads once, when its classes load, so {@link #systemProperties} runs first in main;
 * a property given on the java command line (-D) wins. The rest are ClientConfig and consumer settings.
 */
final class Timers {
    /** The system properties the client reads, with their defaults (ms; the channel idle time in s). */
    static final Map<String, Long> PROPERTIES = new LinkedHashMap<>();

    static {
        PROPERTIES.put("rocketmq.client.rebalance.waitInterval", 20_000L);
        PROPERTIES.put("rocketmq.client.rebalance.minInterval", 1_000L); // 5.2 and later
        PROPERTIES.put("rocketmq.client.rebalance.lockInterval", 20_000L);
        PROPERTIES.put("rocketmq.client.rebalance.lockMaxLiveTime", 30_000L);
        PROPERTIES.put("rocketmq.client.pull.pullMaxIdleTime", 120_000L);
        PROPERTIES.put("rocketmq.client.unlockDelayTimeMills", 20_000L);
        PROPERTIES.put("rocketmq.client.maxTimeConsumeContinuously", 60_000L);
        PROPERTIES.put("com.rocketmq.remoting.client.channel.maxIdleTimeSeconds", 120L);
    }

    private Timers() {
    }

    static long scaled(long value, double scale) {
        return Math.max(1, Math.round(value * scale));
    }

    /** Before any client class is loaded: the scaled properties, and where the client writes its log. */
    static void systemProperties(double scale, String clientLogDir) {
        if (scale != 1) {
            for (Map.Entry<String, Long> e : PROPERTIES.entrySet()) {
                if (System.getProperty(e.getKey()) == null) {
                    System.setProperty(e.getKey(), Long.toString(scaled(e.getValue(), scale)));
                }
            }
        }
        if (clientLogDir != null) {
            System.setProperty("rocketmq.client.logRoot", clientLogDir); // 4.x
            System.setProperty("rocketmq.log.root", clientLogDir); // 5.x
        }
    }

    static void apply(ClientConfig config, double scale) {
        config.setHeartbeatBrokerInterval((int) scaled(30_000, scale));
        config.setPersistConsumerOffsetInterval((int) scaled(5_000, scale));
        config.setPollNameServerInterval((int) scaled(30_000, scale));
    }

    static void apply(DefaultMQPushConsumer consumer, double scale) {
        apply((ClientConfig) consumer, scale);
        consumer.setSuspendCurrentQueueTimeMillis(scaled(1_000, scale));
    }

    static void apply(DefaultLitePullConsumer consumer, double scale) {
        apply((ClientConfig) consumer, scale);
        // The client refuses an auto-commit interval under 1 s.
        consumer.setAutoCommitIntervalMillis(Math.max(1_000, scaled(5_000, scale)));
        consumer.setTopicMetadataCheckIntervalMillis(scaled(30_000, scale));
    }
}
