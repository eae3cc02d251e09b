"""The domain: what a task is and what may happen to it, with no database and no I/O.

The state chart, the events, the task aggregate and its fold, the spec, the intents a
task asks of the world, the scheduling policy, TPU shapes, names, and the ports (the
interfaces the outside world is reached through). Everything else depends on this
layer; it depends on nothing of ours.
"""
