"""Tasks plug into the federated engine: they build the model, batch a client's data, and evaluate it."""
