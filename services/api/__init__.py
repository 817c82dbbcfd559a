"""The HTTP face shared by every service: app factory, health, jobs, middleware."""
