package rmqlab.interop.common;

import sun.misc.Signal;

/**
 * The lab's hung-listener fault, as in the lab's own consumer: SIGUSR1 makes every listener call block (a
 * stuck call) while the client lives on and heartbeats; SIGUSR2 lets the blocked calls return.
 */
public final class ListenerGate {
    private final EventLog events;
    private final String group;
    private boolean open = true;

    public ListenerGate(EventLog events, String group) {
        this.events = events;
        this.group = group;
    }

    public void install() {
        Signal.handle(new Signal("USR1"), s -> hang());
        Signal.handle(new Signal("USR2"), s -> release());
    }

    public synchronized void hang() {
        if (open) {
            open = false;
            events.emit("listener_hung", "group", group);
        }
    }

    public synchronized void release() {
        if (!open) {
            open = true;
            events.emit("listener_released", "group", group);
            notifyAll();
        }
    }

    /** Called by the listener before it works on a message: returns at once unless the gate is shut. */
    public synchronized void pass() throws InterruptedException {
        while (!open) {
            wait();
        }
    }
}
