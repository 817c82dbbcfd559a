"""Trainer: rollout intake, cold-start SFT, CA-GRPO, Proposer RL, weight publishing."""
