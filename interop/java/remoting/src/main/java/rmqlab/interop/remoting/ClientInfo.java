package rmqlab.interop.remoting;

import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;

/** Which client this is (consumer_started names it), and what both consumer kinds share. */
final class ClientInfo {
    private ClientInfo() {
    }

    /** The version of the rocketmq-client this driver was compiled against and runs with, e.g. 4.9.8. */
    static String version() {
        return MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION).replaceFirst("^V", "").replace('_', '.');
    }

    static ConsumeFromWhere consumeFromWhere(Settings s) {
        switch (s.consumeFrom) {
            case "first":
                return ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET;
            case "timestamp":
                return ConsumeFromWhere.CONSUME_FROM_TIMESTAMP;
            default:
                return ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET;
        }
    }

    /**
     * A client whose start() failed keeps its client instance running, and that one goes on heartbeating
     * the group to the brokers: a member nobody consumes for. This takes it out of the group and stops it.
     */
    static void releaseFailedStart(MQClientInstance instance, String group) {
        if (instance != null) {
            instance.unregisterConsumer(group);
            instance.shutdown();
        }
    }
}
