"""Workers of a cluster (replicas, prefill / decode workers), started through one interface:
local processes (`LocalLauncher`) or Ray actors (`RayLauncher`, optional: `tokenmill[ray]`),
kept in step with the router by `ClusterManager`."""
