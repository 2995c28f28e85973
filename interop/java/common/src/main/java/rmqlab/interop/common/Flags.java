package rmqlab.interop.common;

import java.util.LinkedHashMap;
import java.util.Map;

/** Command-line flags in the lab's style: {@code --name value} (or {@code --name=value}) and {@code --switch}. */
public final class Flags {
    /** A bad command line: the message says what, the driver prints it with the usage and exits with 2. */
    public static final class UsageError extends Exception {
        private static final long serialVersionUID = 1L;

        public UsageError(String message) {
            super(message);
        }
    }

    private static final class Spec {
        final String metavar; // null for a switch
        final String help;
        final String defaultValue;

        Spec(String metavar, String defaultValue, String help) {
            this.metavar = metavar;
            this.defaultValue = defaultValue;
            this.help = help;
        }
    }

    private final String usageLine;
    private final Map<String, Spec> specs = new LinkedHashMap<>();
    private final Map<String, String> aliases = new LinkedHashMap<>();
    private final Map<String, String> values = new LinkedHashMap<>();

    public Flags(String usageLine) {
        this.usageLine = usageLine;
    }

    /** A flag that takes a value; {@code defaultValue} may be null (absent). */
    public Flags option(String name, String metavar, String defaultValue, String help) {
        specs.put(name, new Spec(metavar, defaultValue, help));
        return this;
    }

    /** A flag without a value: present or not. */
    public Flags toggle(String name, String help) {
        specs.put(name, new Spec(null, null, help));
        return this;
    }

    public Flags alias(String alias, String name) {
        aliases.put(alias, name);
        return this;
    }

    public void parse(String[] args) throws UsageError {
        for (int i = 0; i < args.length; i++) {
            String arg = args[i];
            String inline = null;
            int eq = arg.indexOf('=');
            if (arg.startsWith("--") && eq > 0) {
                inline = arg.substring(eq + 1);
                arg = arg.substring(0, eq);
            }
            String name = aliases.getOrDefault(arg, arg);
            Spec spec = specs.get(name);
            if (spec == null) {
                throw new UsageError("unknown option " + arg);
            }
            if (spec.metavar == null) {
                if (inline != null) {
                    throw new UsageError(arg + " takes no value");
                }
                values.put(name, "true");
            } else if (inline != null) {
                values.put(name, inline);
            } else if (i + 1 < args.length) {
                values.put(name, args[++i]);
            } else {
                throw new UsageError(arg + " needs a value (" + spec.metavar + ")");
            }
        }
    }

    public boolean isSet(String name) {
        return values.containsKey(name);
    }

    /** The value given, else the default (null when neither). */
    public String get(String name) {
        Spec spec = specs.get(name);
        if (spec == null) {
            throw new IllegalArgumentException("no flag " + name);
        }
        return values.getOrDefault(name, spec.defaultValue);
    }

    public String require(String name) throws UsageError {
        String value = get(name);
        if (value == null || value.isEmpty()) {
            throw new UsageError(name + " is required");
        }
        return value;
    }

    public int getInt(String name, int min) throws UsageError {
        String value = get(name);
        try {
            int n = Integer.parseInt(value);
            if (n < min) {
                throw new UsageError(name + " must be at least " + min + ", got " + value);
            }
            return n;
        } catch (NumberFormatException e) {
            throw new UsageError(name + " expects an integer, got " + value);
        }
    }

    public double getPositiveDouble(String name) throws UsageError {
        String value = get(name);
        try {
            double d = Double.parseDouble(value);
            if (!(d > 0) || Double.isInfinite(d)) {
                throw new UsageError(name + " must be a positive number, got " + value);
            }
            return d;
        } catch (NumberFormatException e) {
            throw new UsageError(name + " expects a number, got " + value);
        }
    }

    public String usage() {
        StringBuilder out = new StringBuilder("usage: ").append(usageLine).append("\n\noptions:\n");
        for (Map.Entry<String, Spec> e : specs.entrySet()) {
            Spec spec = e.getValue();
            String left = "  " + e.getKey() + (spec.metavar != null ? " " + spec.metavar : "");
            for (Map.Entry<String, String> a : aliases.entrySet()) {
                if (a.getValue().equals(e.getKey())) {
                    left += " (or " + a.getKey() + ")";
                }
            }
            out.append(String.format("%-36s %s", left, spec.help));
            if (spec.defaultValue != null) {
                out.append(" (default ").append(spec.defaultValue).append(')');
            }
            out.append('\n');
        }
        return out.toString();
    }
}
