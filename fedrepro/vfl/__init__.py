"""Vertical federated learning for SS-VFNAS: the split-learning protocol, its DP mechanisms and the NAS update rules."""
