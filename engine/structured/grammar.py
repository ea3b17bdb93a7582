"""Compiling requests' grammars for the model's tokenizer off the step thread, and their matchers.

``GrammarCompiler.submit`` returns at once with a ``RequestGrammar`` whose matcher is built on a
small thread pool (the tokenizer conversion, ~0.3 s for a 49k vocabulary, happens there once,
on the first request). The scheduler does not start a sequence until its grammar is ready, so a
big schema delays that request only; llguidance drops the GIL while it builds, so the step
thread keeps running meanwhile.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

logger = logging.getLogger(__name__)

COMPILE_THREADS = 2


class GrammarCompiler:
    """One per engine: the llguidance tokenizer (built lazily) and the compile pool."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids: list[int]):
        self._hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self._ll_tokenizer = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._executor = None  # llguidance's mask-filling thread pool, made on first use

    def submit(self, grammar: str) -> RequestGrammar:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar-compile")
        return RequestGrammar(self._pool.submit(self._compile, grammar), self)

    def tokenizer(self):
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                # EOS: the tokenizer's own; the engine's other stop ids are masked out, so a
                # constrained row ends through the grammar's end only
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self._eos_token())
            return self._ll_tokenizer

    def _eos_token(self) -> int | None:
        eos = self._hf_tokenizer.eos_token_id
        return eos if eos is not None else (self._eos_token_ids[0] if self._eos_token_ids else None)

    def _compile(self, grammar: str):
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def mask_executor(self):
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        return self._executor

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class RequestGrammar:
    """One request's matcher: ready once compiled; advanced by every token the request accepts."""

    def __init__(self, future: Future, compiler: GrammarCompiler):
        self._future = future
        self.compiler = compiler
        self.matcher = None
        self.num_accepted = 0

    @property
    def ready(self) -> bool:
        """Compiled, or failed (``error``): the request is then scheduled, and its first
        sampling step fails it alone (the engine's per-request failure path)."""
        done = self._future.done()  # once: it may turn true between two reads
        if done and self.matcher is None and self._future.exception() is None:
            self.matcher = self._future.result()
        return done

    @property
    def error(self) -> str | None:
        if not self._future.done() or self._future.exception() is None:
            return None
        return str(self._future.exception()) or type(self._future.exception()).__name__

    def wait(self, timeout: float | None = None) -> None:
        """Block until compiled or ``timeout`` seconds have passed."""
        from concurrent.futures import wait

        wait([self._future], timeout)

    def accept(self, token_id: int) -> bool:
        """Advance by ``token_id``; False if the grammar does not allow it (the matcher is then
        in an error state)."""
        self.num_accepted += 1
        return self.matcher.consume_token(token_id)

    @property
    def is_finished(self) -> bool:
        """The grammar is complete and allows no further token (not even more of a number)."""
        return self.matcher.is_stopped()

    def replay(self, token_ids: list[int]) -> None:
        """Rebuild the matcher's state from the request's output tokens (after a preemption: the
        sequence is recomputed from its tokens, and so is the grammar's position)."""
        self.matcher.reset()
        self.num_accepted = 0
        if token_ids and not self.matcher.consume_tokens(list(token_ids)):
            raise ValueError(f"the output no longer matches its grammar: {self.matcher.get_error()}")
        self.num_accepted = len(token_ids)
