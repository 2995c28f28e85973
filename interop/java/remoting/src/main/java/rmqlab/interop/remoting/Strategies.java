package rmqlab.interop.remoting;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import org.apache.rocketmq.client.consumer.AllocateMessageQueueStrategy;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMachineRoomNearby;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragely;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueAveragelyByCircle;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueByConfig;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueByMachineRoom;
import org.apache.rocketmq.client.consumer.rebalance.AllocateMessageQueueConsistentHash;
import org.apache.rocketmq.common.message.MessageQueue;
import rmqlab.interop.common.Flags.UsageError;

/** The client's own allocation strategies, by the names the lab's experiment files use. */
final class Strategies {
    static final List<String> NAMES = Arrays.asList(
        "AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "CONFIG", "MACHINE_ROOM", "MACHINE_ROOM_NEARBY");
    private static final String NEARBY = "MACHINE_ROOM_NEARBY";

    private Strategies() {
    }

    static void check(String name) throws UsageError {
        boolean known = NAMES.contains(name);
        if (name.startsWith(NEARBY + "-")) {
            String inner = name.substring(NEARBY.length() + 1);
            known = NAMES.contains(inner) && !inner.equals(NEARBY);
        }
        if (!known) {
            throw new UsageError("unknown allocation strategy " + name + "; known: " + String.join(", ", NAMES)
                + " (MACHINE_ROOM_NEARBY-<inner> names the inner one)");
        }
    }

    /** The strategy named {@code name}, configured from the CONFIG and MACHINE_ROOM flags. */
    static AllocateMessageQueueStrategy create(String name, Settings s) {
        if (name.equals(NEARBY)) {
            return new AllocateMachineRoomNearby(create("AVG", s), new PrefixRooms());
        }
        if (name.startsWith(NEARBY + "-")) {
            return new AllocateMachineRoomNearby(create(name.substring(NEARBY.length() + 1), s), new PrefixRooms());
        }
        switch (name) {
            case "AVG":
                return new AllocateMessageQueueAveragely();
            case "AVG_BY_CIRCLE":
                return new AllocateMessageQueueAveragelyByCircle();
            case "CONSISTENT_HASH":
                return new AllocateMessageQueueConsistentHash();
            case "CONFIG": {
                // Unconfigured, it answers as the client's class does without a list: nothing.
                AllocateMessageQueueByConfig byConfig = new AllocateMessageQueueByConfig();
                if (s.configQueues != null) {
                    byConfig.setMessageQueueList(queues(s.topic, s.configQueues));
                }
                return byConfig;
            }
            case "MACHINE_ROOM": {
                AllocateMessageQueueByMachineRoom byRoom = new AllocateMessageQueueByMachineRoom();
                if (s.machineRooms != null) {
                    byRoom.setConsumeridcs(words(s.machineRooms));
                }
                return byRoom;
            }
            default:
                throw new IllegalArgumentException("unknown allocation strategy " + name);
        }
    }

    private static List<MessageQueue> queues(String topic, String text) {
        List<MessageQueue> out = new ArrayList<>();
        for (String item : words(text)) {
            int colon = item.lastIndexOf(':');
            if (colon <= 0) {
                throw new IllegalArgumentException("--config-queues expects BROKER:QUEUE_ID, got " + item);
            }
            out.add(new MessageQueue(topic, item.substring(0, colon), Integer.parseInt(item.substring(colon + 1))));
        }
        return out;
    }

    private static Set<String> words(String text) {
        Set<String> out = new LinkedHashSet<>();
        for (String w : text.split(",")) {
            if (!w.trim().isEmpty()) {
                out.add(w.trim());
            }
        }
        return out;
    }

    /**
     * The lab's default machine-room resolver: the room is the text before the first '@' or '-' of a broker
     * name or a client id ("room1@broker-a" is in room1; a client id ip@instance is in its ip's room).
     */
    static final class PrefixRooms implements AllocateMachineRoomNearby.MachineRoomResolver {
        static String roomOf(String name) {
            int cut = name.length();
            for (char sep : new char[] {'@', '-'}) {
                int at = name.indexOf(sep);
                if (at >= 0) {
                    cut = Math.min(cut, at);
                }
            }
            return name.substring(0, cut);
        }

        @Override
        public String brokerDeployIn(MessageQueue messageQueue) {
            return roomOf(messageQueue.getBrokerName());
        }

        @Override
        public String consumerDeployIn(String clientID) {
            return roomOf(clientID);
        }
    }
}
