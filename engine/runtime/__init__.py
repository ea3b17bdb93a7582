"""Running the model on a device: the ModelRunner that loads weights, allocates the KV pool and
executes each scheduled step (model_runner.py), CUDA graph capture for decodes (cuda_graphs.py),
finding the request that breaks a step (isolation.py), and the loop of a tensor-parallel rank > 0
(rank_main.py, run as ``python -m engine.runtime.rank_main``).
"""
