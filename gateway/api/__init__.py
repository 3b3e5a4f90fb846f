"""The routes: the model endpoints (each hands its wire format to the pipeline), passthrough, and the tenant and admin APIs."""
