"""Tensor parallelism: one process per rank over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

Rank 0 is the engine's own process: it owns the scheduler and the sampler. Ranks 1..N-1 are
child processes (engine/distributed/ranks.py, engine/runtime/rank_main.py) that hold their shard of every
weight and of the KV pool and run each step the rank-0 ModelRunner sends them. Inside the
forward, row-parallel projections and the vocabulary-parallel embedding all-reduce, and the
vocabulary-parallel LM head gathers its logits on rank 0, through the engine's own
TensorParallelGroup (engine/distributed/parallel_state.py); engine/layers/parallel.py says how
each rank slices the checkpoint.
"""
