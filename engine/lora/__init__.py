"""LoRA adapters, many per batch: a PEFT folder read and checked against the base
(peft_adapter.py), the resident set with its cap and LRU (slots.py, no torch: the scheduler uses
it), the projections wrapped with a batched LoRA product (layers.py) and the runner's side that
fills slots and maps each step's rows to them (runtime.py)."""
