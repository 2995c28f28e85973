package rmqlab.interop.remoting;

import java.util.List;
import java.util.function.Supplier;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.consumer.store.LocalFileOffsetStore;
import org.apache.rocketmq.client.consumer.store.OffsetStore;
import org.apache.rocketmq.client.consumer.store.RemoteBrokerOffsetStore;
import org.apache.rocketmq.client.impl.consumer.DefaultMQPushConsumerImpl;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.common.ServiceState;
import org.apache.rocketmq.common.message.MessageExt;
import rmqlab.interop.common.EventLog;
import rmqlab.interop.common.ListenerGate;

/** DefaultMQPushConsumer (kinds java and java5), concurrent or orderly, with the recording hooks. */
final class PushDriver implements Driver {
    private final Settings s;
    private final Recorder recorder;
    private final Consumed consumed;
    private DefaultMQPushConsumer consumer;

    PushDriver(Settings s, EventLog events, ListenerGate gate) {
        this.s = s;
        this.recorder = new Recorder(events, s.group);
        this.consumed = new Consumed(events, s.group, recorder::clientId, s.mode(), s.consumeMs, gate);
    }

    @Override
    public String start() throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(s.group);
        consumer = c;
        c.setNamesrvAddr(s.namesrv);
        if (s.instance != null) {
            c.setInstanceName(s.instance);
        }
        c.setMessageModel(ClientVersion.messageModel(s.broadcast));
        c.setConsumeFromWhere(ClientInfo.consumeFromWhere(s));
        if (s.consumeTimestamp != null) {
            c.setConsumeTimestamp(s.consumeTimestamp);
        }
        c.setConsumeThreadMin(s.threads);
        c.setConsumeThreadMax(s.threads);
        c.setAllocateMessageQueueStrategy(new RecordingStrategy(Strategies.create(s.strategy, s), recorder));
        Supplier<MQClientInstance> factory = () -> c.getDefaultMQPushConsumerImpl().getmQClientFactory();
        Supplier<OffsetStore> ownStore = () -> s.broadcast
            ? new LocalFileOffsetStore(factory.get(), s.group)
            : new RemoteBrokerOffsetStore(factory.get(), s.group);
        StartOffsets starts = new StartOffsets(factory, c::getConsumeFromWhere, c::getConsumeTimestamp);
        c.setOffsetStore(ClientVersion.offsetStore(ownStore, this::loaded, recorder, starts, true,
            s.broadcast ? "local" : "broker"));
        Timers.apply(c, s.timeScale);
        ClientVersion.configurePush(c, s, recorder);
        c.subscribe(s.topic, s.expression);
        if (s.orderly) {
            c.registerMessageListener((MessageListenerOrderly) this::consumeOrderly);
        } else {
            c.registerMessageListener((MessageListenerConcurrently) this::consumeConcurrently);
        }
        c.start();
        return c.buildMQClientId();
    }

    /** From the offset store's load(), inside start(): the client id is fixed, no queue is taken yet. */
    private void loaded() {
        recorder.started(consumer.buildMQClientId(), "java-" + ClientInfo.version(), s.kind, s.topic);
    }

    private ConsumeConcurrentlyStatus consumeConcurrently(List<MessageExt> msgs, ConsumeConcurrentlyContext ctx) {
        try {
            for (MessageExt msg : msgs) {
                long started = consumed.begin();
                consumed.work();
                consumed.done(msg, ctx.getMessageQueue(), started);
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return ConsumeConcurrentlyStatus.RECONSUME_LATER;
        }
    }

    private ConsumeOrderlyStatus consumeOrderly(List<MessageExt> msgs, ConsumeOrderlyContext ctx) {
        try {
            for (MessageExt msg : msgs) {
                long started = consumed.begin();
                consumed.work();
                consumed.done(msg, ctx.getMessageQueue(), started);
            }
            return ConsumeOrderlyStatus.SUCCESS;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
        }
    }

    @Override
    public void stop() {
        if (consumer != null) {
            DefaultMQPushConsumerImpl impl = consumer.getDefaultMQPushConsumerImpl();
            if (impl.getServiceState() == ServiceState.START_FAILED) {
                ClientInfo.releaseFailedStart(impl.getmQClientFactory(), s.group);
            } else {
                consumer.shutdown();
            }
        }
        recorder.stopped();
    }
}
