"""Grammar-constrained decoding (structured outputs), on llguidance.

``spec``: what a request may ask for (``SamplingParams.structured_outputs``) and its grammar;
torch-free, so the web process validates with it too. ``grammar``: compiling a request's grammar
for the tokenizer off the step thread, and its matcher advanced per accepted token. ``bitmask``:
the batch's allowed-token bitmask, filled on the host and applied by the sampler.
"""
