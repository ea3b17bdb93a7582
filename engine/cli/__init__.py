"""The engine's command-line tools: `python -m engine generate|chat|bench` (main.py) and the
checkpoint tools the webapp runs as children (validate.py, convert.py, tokenizer_export.py)."""
