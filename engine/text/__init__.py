"""Text in and out: loading a model's tokenizer and its chat template (tokenizer.py), and turning
generated ids back into text a stream can send, piece by piece (detokenizer.py).
"""
