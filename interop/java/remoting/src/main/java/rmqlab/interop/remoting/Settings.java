package rmqlab.interop.remoting;

import java.util.Arrays;
import java.util.Locale;
import rmqlab.interop.common.Flags;
import rmqlab.interop.common.Flags.UsageError;

/** The driver's command line, for the kinds over RocketMQ's remoting protocol (java, java5, java-lite). */
final class Settings {
    final String kind;
    final String namesrv;
    final String group;
    final String topic;
    final String expression;
    final boolean orderly;
    final boolean broadcast;
    final String strategy;
    final String configQueues;
    final String machineRooms;
    final int consumeMs;
    final int threads;
    final String consumeFrom;
    final String consumeTimestamp;
    final String instance;
    final double timeScale;
    final String node;
    final String logFile;
    final String clientLogDir;

    private Settings(Flags f) throws UsageError {
        kind = f.get("--kind");
        if (!ClientVersion.KINDS.contains(kind)) {
            throw new UsageError("--kind " + kind + " is not built on rocketmq-client " + ClientInfo.version()
                + " (this one runs " + String.join(", ", ClientVersion.KINDS) + ")");
        }
        namesrv = f.require("--namesrv");
        group = f.require("--group");
        topic = f.require("--topic");
        expression = f.get("--expression");
        orderly = f.isSet("--orderly");
        broadcast = f.isSet("--broadcast");
        strategy = f.get("--strategy").toUpperCase(Locale.ROOT);
        Strategies.check(strategy);
        configQueues = f.get("--config-queues");
        machineRooms = f.get("--machine-rooms");
        consumeMs = f.getInt("--consume-ms", 0);
        threads = f.getInt("--threads", 1);
        consumeFrom = f.get("--consume-from");
        if (!Arrays.asList("first", "last", "timestamp").contains(consumeFrom)) {
            throw new UsageError("--consume-from is first, last or timestamp, got " + consumeFrom);
        }
        consumeTimestamp = f.get("--consume-timestamp");
        instance = f.get("--instance");
        timeScale = f.getPositiveDouble("--time-scale");
        node = f.get("--node") != null ? f.get("--node") : kind + "-" + ProcessHandle.current().pid();
        logFile = f.get("--log-file");
        clientLogDir = f.get("--client-log-dir");
        if (orderly && kind.equals("java-lite")) {
            throw new UsageError("--orderly is for a push consumer (java, java5): a lite pull consumer has no "
                + "orderly listener");
        }
    }

    static Flags flags() {
        return new Flags("consumer.sh --kind java|java5|java-lite --namesrv HOST:PORT --group G --topic T [options]")
            .option("--kind", "KIND", ClientVersion.KINDS.get(0),
                "java (DefaultMQPushConsumer 4.9.8), java5 (DefaultMQPushConsumer 5.x: the broker assigns), "
                    + "java-lite (DefaultLitePullConsumer 4.9.8)")
            .option("--namesrv", "HOST:PORT", null, "name server address (the emulator's native port)")
            .option("--group", "G", null, "consumer group")
            .option("--topic", "T", null, "topic to subscribe")
            .option("--expression", "EXPR", "*", "subscription expression (tags, e.g. 'TagA || TagB')")
            .alias("--tags", "--expression")
            .toggle("--orderly", "orderly listener (queues locked at the broker)")
            .toggle("--broadcast", "BROADCASTING instead of CLUSTERING")
            .option("--strategy", "NAME", "AVG", "allocation strategy: " + String.join(", ", Strategies.NAMES)
                + " (MACHINE_ROOM_NEARBY-<inner> names the inner one)")
            .option("--config-queues", "BROKER:ID,...", null, "CONFIG: the queues of --topic it allocates")
            .option("--machine-rooms", "ROOM,...", null, "MACHINE_ROOM: the consumer's rooms (consumeridcs)")
            .option("--consume-ms", "MS", "0", "time the listener takes per message")
            .option("--threads", "N", "4", "consume threads (push) or pull threads (lite)")
            .option("--consume-from", "WHERE", "last", "first, last or timestamp: where a new group starts")
            .option("--consume-timestamp", "yyyyMMddHHmmss", null, "for --consume-from timestamp")
            .option("--instance", "NAME", null,
                "instanceName (default: the client's own, pid#nanotime for a clustering consumer)")
            .option("--time-scale", "X", "1", "multiply the client's scalable timers by X (0.5: twice as fast)")
            .option("--node", "NAME", null, "node name in events (default <kind>-<pid>)")
            .option("--log-file", "PATH", null, "events file (JSON lines); stderr when absent")
            .option("--client-log-dir", "DIR", null, "folder the client writes its own log to")
            .toggle("--help", "print this help");
    }

    /** Null when the flags asked for help (printed). */
    static Settings parse(String[] args) throws UsageError {
        Flags f = flags();
        f.parse(args);
        if (f.isSet("--help")) {
            System.out.print(f.usage());
            return null;
        }
        return new Settings(f);
    }

    String mode() {
        return orderly ? "ORDERLY" : "CONCURRENTLY";
    }
}
