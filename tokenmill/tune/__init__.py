"""`tokenmill tune`: sweeps engine settings on a workload, fits the latency/throughput Pareto
frontier and picks the best configuration meeting an SLO."""
