"""Profiles: the model (:mod:`~gputuned.profile.model`, which says what a profile is) and its
tables (``tables/``, one model and manual each), loading with includes (``load``), problems as
key paths and plain messages (``messages``), checks across tables (``checks``) and of command
line patterns (``patterns``), the JSON schema and generated docs (``schema``), and the CPU sets
(``cpusets``, ``cpuresolve``)."""
