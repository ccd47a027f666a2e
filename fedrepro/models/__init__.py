"""Backbones (tiny random BERT, the packaged MiniLM, or any hub name / local directory) and task heads."""
