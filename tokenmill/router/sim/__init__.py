"""A discrete-event simulation of the router at scale: the real `Router` (its index, policy,
cost model and bookings) in front of N simulated replicas, each with the engine's own KV
cache manager (block pool, LRU eviction, KV events) and a continuous-batching step loop
whose step time comes from measured costs. See `simulator.Simulation`."""
