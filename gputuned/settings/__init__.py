"""Settings: one class per kind of value gputuned writes (:mod:`gputuned.settings.base`), each
with its read, write, read-back, "not possible here" and journal check; the registry
(:mod:`gputuned.settings.registry`) finds them."""
