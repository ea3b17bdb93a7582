"""Turning a step's logits into tokens: the per-step sampling tensors built from each request's
SamplingParams (sampling_metadata.py), the Sampler module (temperature, top-k/top-p/min-p,
penalties, grammar masks, logprobs; sampler.py), and ``n > 1`` samples that share one prompt's KV
blocks (parallel_sampling.py).
"""
