"""The HTTP layer: the FastAPI app, its dependencies, response schemas, Prometheus
metrics, the per-agent views and the shipped dashboard."""
