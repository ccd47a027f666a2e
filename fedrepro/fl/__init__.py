"""One federated engine: a fixed round loop (engine.py), algorithms as small hook classes (algorithms/),
one channel that every tensor crossing a boundary passes through (channel.py), and safetensors/JSON
checkpoints (checkpoint.py)."""
