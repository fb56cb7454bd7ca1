"""Benchmarks of a server: `bench --endpoint` and its check, `loadtest`, `serve-bench`, and the servers they start."""
