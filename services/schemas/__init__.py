"""Pydantic schemas at every boundary, shared by the services and their clients."""
