package rmqlab.interop.common;

import java.util.concurrent.CountDownLatch;
import sun.misc.Signal;

/**
 * How a driver ends. SIGTERM and SIGINT exit with status 0, and the stop action (the client's shutdown()
 * and the {@code consumer_stopped} event) runs once, in a shutdown hook, on any orderly exit. SIGKILL ends
 * the process without it; SIGSTOP and SIGCONT pause and resume the whole JVM.
 */
public final class Lifecycle {
    private static final CountDownLatch FOREVER = new CountDownLatch(1);

    private Lifecycle() {
    }

    public static void onStop(Runnable stop) {
        Runtime.getRuntime().addShutdownHook(new Thread(stop, "lab-stop"));
        Signal.handle(new Signal("TERM"), s -> System.exit(0));
        Signal.handle(new Signal("INT"), s -> System.exit(0));
    }

    /** The main thread's last call: the process lives until a signal ends it. */
    public static void awaitSignal() throws InterruptedException {
        FOREVER.await();
    }

    /** Prints the line the lab waits for: {@code READY <client id>}. */
    public static void ready(String clientId) {
        System.out.println("READY " + clientId);
        System.out.flush();
    }
}
