"""Ray Tune: the trainable, the driver's session record, live hooks, progress output, resource waits."""
