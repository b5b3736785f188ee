"""The engine: plan (read the host once, ask each tuner), apply (journal, write, read back,
undo), revert, verify, the journal and what its entries may hold."""
