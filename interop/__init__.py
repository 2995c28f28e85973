"""Drivers that put Apache's RocketMQ clients into the lab's groups.

Each runs under the real client's own interpreter or Node.js (see ``rmqlab.chaos.realclients``), not
imported by the lab: the folder ships as package data so that an installed lab finds its drivers.
"""
