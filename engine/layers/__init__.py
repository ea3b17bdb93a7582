"""Model building blocks: attention (with the per-step metadata it reads), norms, rotary,
activation, linear layers (with their weight loaders)."""
