package rmqlab.interop.common;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.Map;

/**
 * The driver's event file: EVENTS.md lines, one JSON object per line ({@code ts_ms}, {@code event},
 * {@code node}, {@code role}, then the event's fields), each written with one call and unbuffered, since the
 * process may be killed at any moment.
 */
public final class EventLog {
    private final String node;
    private final String role;
    private final OutputStream out;
    private final boolean ownsOut;

    /** Appends to {@code path}, or writes to stderr when it is null. */
    public EventLog(String node, String role, String path) throws IOException {
        this.node = node;
        this.role = role;
        this.ownsOut = path != null;
        this.out = path != null ? new FileOutputStream(path, true) : System.err;
    }

    public String node() {
        return node;
    }

    /** Writes one event; {@code fields} are name, value pairs (strings, numbers, booleans, collections). */
    public void emit(String event, Object... fields) {
        if (fields.length % 2 != 0) {
            throw new IllegalArgumentException("fields must come in name, value pairs");
        }
        StringBuilder rest = new StringBuilder(160);
        field(rest, "event", event);
        field(rest, "node", node);
        field(rest, "role", role);
        for (int i = 0; i < fields.length; i += 2) {
            field(rest, (String) fields[i], fields[i + 1]);
        }
        rest.append("}\n");
        synchronized (this) {
            // The time is taken under the lock, so that the file is in time order.
            byte[] bytes = ("{\"ts_ms\":" + System.currentTimeMillis() + rest).getBytes(StandardCharsets.UTF_8);
            try {
                out.write(bytes);
                out.flush();
            } catch (IOException e) {
                System.err.println("event log: " + e);
            }
        }
    }

    public synchronized void close() {
        if (ownsOut) {
            try {
                out.close();
            } catch (IOException e) {
                System.err.println("event log: " + e);
            }
        }
    }

    private static void field(StringBuilder line, String name, Object value) {
        line.append(',');
        string(line, name);
        line.append(':');
        value(line, value);
    }

    static void value(StringBuilder out, Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Boolean || value instanceof Integer || value instanceof Long
            || value instanceof Short || value instanceof Byte) {
            out.append(value);
        } else if (value instanceof Number) {
            double d = ((Number) value).doubleValue();
            out.append(Double.isFinite(d) ? String.valueOf(d) : "null");
        } else if (value instanceof Collection) {
            out.append('[');
            boolean first = true;
            for (Object item : (Collection<?>) value) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                value(out, item);
            }
            out.append(']');
        } else if (value instanceof Map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                string(out, String.valueOf(e.getKey()));
                out.append(':');
                value(out, e.getValue());
            }
            out.append('}');
        } else {
            string(out, value.toString());
        }
    }

    static void string(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"':
                    out.append("\\\"");
                    break;
                case '\\':
                    out.append("\\\\");
                    break;
                case '\n':
                    out.append("\\n");
                    break;
                case '\r':
                    out.append("\\r");
                    break;
                case '\t':
                    out.append("\\t");
                    break;
                default:
                    if (c < 0x20 || c == '\u2028' || c == '\u2029') {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        out.append('"');
    }
}
