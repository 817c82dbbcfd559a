"""Reward service: sandboxed compile, verify and benchmark of untrusted kernels; CA-GRPO rewards."""
