"""The providers' side: the narrow call/stream seam, deployments and routing, errors, spans; LiteLLM inside `litellm_client`."""
