"""Durable records: SQLAlchemy tables and repositories, the blob store.

May import `policies`, never `gateway` (see DESIGN.md, "Layers").
"""
