"""rmq-proxy: a gRPC endpoint of RocketMQ 5 for Apache's v5 clients."""
