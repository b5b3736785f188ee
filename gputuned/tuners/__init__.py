"""Tuners: one module per TOML table, each with its pydantic ``Config`` and its tuner."""
