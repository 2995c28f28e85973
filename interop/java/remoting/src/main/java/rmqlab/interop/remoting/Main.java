package rmqlab.interop.remoting;

import rmqlab.interop.common.EventLog;
import rmqlab.interop.common.Flags.UsageError;
import rmqlab.interop.common.Lifecycle;
import rmqlab.interop.common.ListenerGate;

/**
 * The lab's driver for Apache's Java client over RocketMQ's remoting protocol: joins a group, consumes, and
 * writes EVENTS.md lines from the client's own hooks. Prints {@code READY <client id>} once started;
 * SIGTERM or SIGINT shut it down gracefully; SIGUSR1 hangs the listener and SIGUSR2 releases it.
 */
public final class Main {
    static final int START_ATTEMPTS = 3;

    private Main() {
    }

    /**
     * The client's start(), again with a new client if it fails (at most {@value #START_ATTEMPTS} times): a
     * client cannot start twice, and on a busy machine a cold JVM's first name server request can outlast
     * the client's 3 s timeout. The failed client is shut down first ({@code consumer_stopped}).
     */
    private static String start(Driver driver, EventLog events) throws InterruptedException {
        for (int attempt = 1; ; attempt++) {
            try {
                return driver.start();
            } catch (Exception e) {
                if (attempt == START_ATTEMPTS) {
                    System.err.println("consumer: could not start: " + e);
                    System.exit(1);
                }
                events.emit("log", "level", "warning", "msg", "start failed, starting a new client: " + e);
                driver.stop();
                Thread.sleep(1_000);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        Settings s;
        try {
            s = Settings.parse(args);
        } catch (UsageError e) {
            System.err.println("consumer: " + e.getMessage());
            System.err.print(Settings.flags().usage());
            System.exit(2);
            return;
        }
        if (s == null) {
            return; // --help
        }
        // First: the client reads these when its classes load.
        Timers.systemProperties(s.timeScale, s.clientLogDir);
        EventLog events = new EventLog(s.node, "consumer", s.logFile);
        ListenerGate gate = new ListenerGate(events, s.group);
        gate.install();
        Driver driver = s.kind.equals("java-lite") ? new LiteDriver(s, events, gate) : new PushDriver(s, events, gate);
        Lifecycle.onStop(() -> {
            driver.stop();
            events.close();
        });
        Lifecycle.ready(start(driver, events));
        Lifecycle.awaitSignal();
    }
}
