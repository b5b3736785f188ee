"""The profile's tables, one module each: its model (the keys, their types, bounds and
descriptions) and, in the module's docstring, its manual (docs/profiles.md is built from both).
Models only: what a table makes happen is planned in gputuned/tuners/."""
