"""The Batch API (/v1/files, /v1/batches) and the offline `tokenmill batch` command."""
