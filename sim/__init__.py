"""The simulator: the real roles on a virtual clock and an in-memory network, one process, one seed."""
