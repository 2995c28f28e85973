package rmqlab.interop.remoting;

import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;

/** Which client this is (consumer_started names it), and the consume-from setting of both consumer kinds. */
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
}
