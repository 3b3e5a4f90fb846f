"""The HTTP surface: FastAPI app, authentication, ingest, upstream, CLI.

May import `policies` and `storage` (see DESIGN.md, "Layers").
"""
