"""gputuned: host tuning for GPU inference servers on shared Linux machines."""

__version__ = "0.1.0"
