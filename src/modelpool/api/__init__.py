"""HTTP layer: routes, wire schemas, SSE, error rendering. Thin translators over the runtime."""
