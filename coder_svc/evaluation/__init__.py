"""Evaluation of a Coder model on a KernelBench-format problem set: metrics, the resumable harness, reports."""
