"""Ranking metrics (MAP, MRR) for FedMatch's answer selection, computed with pytrec_eval and cross-checked
with ranx."""
