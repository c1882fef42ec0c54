"""The app root: where the FastAPI app is assembled from the leaves (`api` routes, the
`mcp_server`, the `ui`) and the pool, with its middlewares, lifespan and the uvicorn pieces
that are about serving. Only `cli` and `ray_serve` import it."""
