"""KV transfer between a prefill worker and decode workers (prefill/decode disaggregation).

The split follows vLLM's KV connector:

- scheduler side: `producer.KVProducer` (prefill worker) registers a request's transfer,
  publishes its blocks as they are computed and, when the request finishes, holds the blocks
  under a lease instead of freeing them (`request_finished`); `consumer.KVConsumer` (decode
  worker) parks a request while its prompt's blocks are pulled, then hands them to the KV
  manager, which counts them as computed (`KVCacheManager.received`) and allocates slots.
- worker side: `server.KVBlockServer` reads the blocks out of the KV pool, layer by layer,
  into frames (`carriers`: TCP multipart frames, or a shared-memory segment for a peer on
  the same host); `client.pull_blocks` checks every frame's checksum and every block's hash
  and rebuilds the blocks; the consumer writes them through the engine's `BlockIO` and
  confirms, which ends the lease (blocks go back to the prefill worker's prefix cache).

A failed, corrupted, timed-out or cancelled transfer never leaves bad KV behind: the decode
worker recomputes the prompt (`--kv-load-failure-policy recompute`) or fails the request
(`fail`). Wire format: `wire.py`.
"""
