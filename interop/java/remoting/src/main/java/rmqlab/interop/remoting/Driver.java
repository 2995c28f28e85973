package rmqlab.interop.remoting;

/** One kind of consumer: started once by main, stopped once by the shutdown hook. */
interface Driver {
    /** Starts the client and returns its client id (clientIP@instanceName). */
    String start() throws Exception;

    /** The client's shutdown(), then {@code consumer_stopped}. */
    void stop();
}
