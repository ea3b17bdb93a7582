"""How much memory the engine takes and gives back: the KV pool's size (kv_pool_sizing.py, one
formula), CUDA memory measured with a dummy step (gpu_memory.py), a prediction before anything
loads (estimate.py), and the host heap returned after a load (host_memory.py).
"""
