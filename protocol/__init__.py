"""The wire (msgpack frames with RocketMQ's codes and field names), model types, remoting, shared runtime."""
