"""Proposer service: API co-occurrence, module composition, validation, the frontier reward."""
