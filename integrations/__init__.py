"""Adapters that put the reward service where other tools already call rewards, one module per tool:

- ``integrations.trl``: ``kernel_reward`` for ``GRPOTrainer(reward_funcs=[...])``;
- ``integrations.verl``: ``compute_score`` (and ``compute_score_batch``) for verl's reward managers;
- ``integrations.kernelbench``: ``eval_kernel_against_ref``, a drop-in for KernelBench's ``src.eval``;
- ``integrations.ci``: ``kernelzero ci``, a verified kernel for a module from a CI job.

OpenRLHF needs no adapter here: the reward service answers its remote reward protocol itself
(``POST /get_reward``). Every adapter is a client over HTTP (``services.clients``): it imports the shared
layer, never a service's code (tests/test_architecture.py holds it to that).
"""
