"""Model families, their checkpoint loaders and the registry of names (no heavy imports here)."""
