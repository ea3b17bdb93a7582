"""Tensor parallelism: one process per rank over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

Rank 0 is the engine's own process: it owns the scheduler and the sampler. Ranks 1..N-1 are
spawned children (engine/distributed/ranks.py) that hold their shard of every weight and of the
KV pool and run each step the rank-0 ModelRunner sends them (engine/distributed/step.py). Inside
the forward, row-parallel projections and the vocabulary-parallel embedding all-reduce, and the
vocabulary-parallel LM head gathers its logits on rank 0 (engine/distributed/parallel_state.py).
"""
