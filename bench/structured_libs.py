"""Grammar libraries side by side on this CPU: schema compilation time and per-token mask cost.

Usage: python bench/structured_libs.py [model]   (default smollm2: vocabulary 49152)

For each of three JSON schemas (nested objects, arrays, enums, required fields) it compiles the
schema with xgrammar and llguidance (median of 3, cold caches) and walks a valid document token
by token, filling the next-token bitmask before each token; the mean fill time is the per-token
cost a constrained row adds to a decode step.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"}}, "required": ["name", "age"]},
    "order": {"type": "object", "properties": {
        "id": {"type": "integer"}, "status": {"enum": ["open", "paid", "shipped"]},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}}, "required": ["sku", "qty"]}},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string"},
            "address": {"type": "object", "properties": {
                "city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"]}}, "required": ["name", "address"]}},
        "required": ["id", "status", "items", "customer"]},
    "catalog": {"type": "object", "properties": {"products": {"type": "array", "items": {
        "type": "object", "properties": {
            "title": {"type": "string", "maxLength": 40},
            "price": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
            "kind": {"enum": ["book", "toy", "food", "tool", "game"]},
            "stock": {"type": "object", "properties": {"count": {"type": "integer"},
                                                        "where": {"type": "string"}}}},
        "required": ["title", "price", "kind"]}}}, "required": ["products"]},
}
DOCS = {
    "person": {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com"},
    "order": {"id": 7, "status": "paid", "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-9", "qty": 1}],
              "customer": {"name": "Bob", "address": {"city": "Oslo", "zip": "0150"}}},
    "catalog": {"products": [{"title": "Dune", "price": 9.5, "tags": ["sf", "classic"], "kind": "book",
                              "stock": {"count": 3, "where": "A2"}},
                             {"title": "Yo-yo", "price": 2, "kind": "toy"}]},
}


def _median(fn, n=3):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_xgrammar(tokenizer, vocab):
    import torch
    import xgrammar as xgr
    t = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    setup = time.perf_counter() - t
    rows = {}
    for name, schema in SCHEMAS.items():
        compile_s = _median(lambda: xgr.GrammarCompiler(info, cache_enabled=False)
                            .compile_json_schema(json.dumps(schema)))
        compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema))
        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, vocab)
        ids = tokenizer.encode(json.dumps(DOCS[name]), add_special_tokens=False)
        fill = []
        for tid in ids:
            t = time.perf_counter()
            matcher.fill_next_token_bitmask(mask)
            fill.append(time.perf_counter() - t)
            assert matcher.accept_token(tid), (name, tid)
        rows[name] = (compile_s, statistics.mean(fill), len(ids))
        del torch
        import torch  # noqa: F401
    return setup, rows


def bench_llguidance(tokenizer, vocab):
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt
    t = time.perf_counter()
    tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    setup = time.perf_counter() - t
    rows = {}
    for name, schema in SCHEMAS.items():
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        compile_s = _median(lambda: llguidance.LLMatcher(tok, grammar))
        matcher = llguidance.LLMatcher(tok, grammar)
        assert not matcher.is_error(), matcher.get_error()
        mask = lt.allocate_token_bitmask(1, vocab)
        ids = tokenizer.encode(json.dumps(DOCS[name]), add_special_tokens=False)
        fill = []
        for tid in ids:
            t = time.perf_counter()
            lt.fill_next_token_bitmask(matcher, mask)
            fill.append(time.perf_counter() - t)
            assert matcher.consume_token(tid), (name, tid, matcher.get_error())
        rows[name] = (compile_s, statistics.mean(fill), len(ids))
    return setup, rows


def main() -> None:
    sys.path.insert(0, ".")
    from engine.text.tokenizer import load_tokenizer
    model = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
    tokenizer = load_tokenizer(model)
    vocab = len(tokenizer)
    print(f"model {model}, vocabulary {vocab}")
    for lib, fn in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
        setup, rows = fn(tokenizer, vocab)
        print(f"{lib}: tokenizer setup {setup * 1e3:.0f} ms")
        for name, (compile_s, fill_s, n) in rows.items():
            print(f"  {name:8s} compile {compile_s * 1e3:8.2f} ms   mask fill {fill_s * 1e6:7.1f} us/token"
                  f" ({n} tokens)")


if __name__ == "__main__":
    main()
