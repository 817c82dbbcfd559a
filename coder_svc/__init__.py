"""Coder service: model backends, prompts, code extraction, best-of-n kernel generation."""
