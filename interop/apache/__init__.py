"""Apache RocketMQ's own name server and broker as an engine of the lab (``engine.py``).

Pure interop: it starts Apache's JVMs and talks to them with the native codec of ``rmqlab.protocol``;
nothing here knows about experiments or the lab's core.
"""
