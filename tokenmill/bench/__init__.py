"""`tokenmill bench`: load generation and reports against OpenAI-compatible servers.

Layout: config (frozen specs), lengths (length distributions), schedule (arrival times),
prompts + workloads (what is sent), client (one streamed request → RequestRecord),
runner (async scheduler), metrics (vLLM `bench serve` definitions), sweep, peers (managed
tokenmill / llama-server processes), compare, report/ (console, files, plots, HTML), cli.
"""
