"""Composition of KernelBench-format modules from API sets: programmatic and LLM, one interface."""
