"""Which sequences run each step: requests checked on the way in (admission.py), their token
state (sequence.py), the paged KV blocks they hold (block_manager.py), the continuous-batching
scheduler that chooses, preempts and finishes them (scheduler.py), its weighted fair share
across tenants (fair_share.py), and the flat tensors one scheduler decision becomes
(input_batch.py).

Everything but input_batch.py imports no torch, so the scheduling rules are unit-tested fast on
any machine.
"""
