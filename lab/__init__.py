"""The lab core, the same for every backend: the experiment model and its parser, the schedule, the live
tally, the one Runner and the Backend protocol that local processes, containers and the simulator
implement."""
