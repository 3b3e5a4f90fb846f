"""LiteLLM, and the only modules that import it: the client behind the upstream seam, the router, the direct transport's preparation."""
