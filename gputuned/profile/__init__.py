"""Profiles: the model (:mod:`~gputuned.profile.model`, which says what a profile is), loading
with includes (``load``), problems as key paths and plain messages (``messages``), checks across
tables (``checks``), the JSON schema and generated docs (``schema``), and the CPU sets
(``cpusets``, ``cpuresolve``, ``layout``, ``topology``)."""
