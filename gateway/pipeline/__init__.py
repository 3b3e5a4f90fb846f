"""The request path, the same for every wire format: authenticate, capture, project under the policy, forward, record."""
