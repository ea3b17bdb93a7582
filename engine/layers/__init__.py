"""Model building blocks: attention, norms, rotary, activation, linear layers (with their weight
loaders) and the sampler."""
