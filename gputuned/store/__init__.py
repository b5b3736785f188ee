"""gputuned's own files: active.json, state.json, the journal's file, the host lock and durable
writes (``state``); files a user names, with their owner and mode checked (``userfiles``)."""
