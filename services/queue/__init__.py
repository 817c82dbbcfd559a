"""Celery over Redis: one queue per workload, jobs recorded in the database."""
