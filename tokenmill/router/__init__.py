"""Cache-aware router in front of engine replicas (`tokenmill router`, `tokenmill cluster`).

A request is tokenized and hashed exactly as the engine does; the router knows which block
hashes each replica holds (from the replicas' KV event streams, or, without events, from its
own past decisions) and sends the request where the prefill work left after the cached
overlap plus the current load is smallest. Health checks, one retry before the first token
and clean stream errors cover replicas that die.
"""
