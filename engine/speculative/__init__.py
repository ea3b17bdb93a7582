"""Speculative decoding: draft tokens proposed cheaply, verified by one forward of the model.

ngram.py proposes drafts by prompt lookup (the request's own prompt and output); drafting.py
decides, per sequence and per step, whether and how much to draft; verify.py keeps the longest
prefix of a draft that the model itself would have produced. Greedy and seeded answers are the
model's own, token for token: see verify.py.
"""
