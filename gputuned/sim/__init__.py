"""The simulated kernel: a host tree served as its kernel would serve it (``--root DIR``).

:class:`~gputuned.sim.tree.SimKernel` is the backend of the kernel port for a tree; the rest
of this package is the kernel model it writes through. Only :mod:`gputuned.root`, where
``--root`` is parsed, chooses it; nothing else in gputuned imports this package.
"""
