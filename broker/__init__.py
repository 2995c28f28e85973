"""The broker and the name server: RocketMQ's ConsumerManager, ConsumerOffsetManager,
RebalanceLockManager, message store, pull with long polling, and route registration."""
