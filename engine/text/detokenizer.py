"""Incremental detokenization of one request's output, with stop strings.

Text is produced by windowed decoding (vLLM's ``detokenize_incrementally``,
transformers' ``TextStreamer``): only the ids from ``prefix_offset`` on are
decoded, and the new text is what that window decodes to beyond its first part
``[prefix_offset, read_offset)``. Both decodes start at the same token, so a
decoder that treats the first token specially (the SentencePiece leading-space
strip of Llama 2's ``Strip`` / ``Metaspace`` decoders) does so in both and the
difference is exact; only the very first window starts at output position 0,
where ``decode(output_ids)`` strips too. The text is therefore
``tokenizer.decode(output_ids)`` and does not depend on the prompt. (This needs
the window's text to extend its first part's text, true of byte-level and
byte-fallback decoders; transformers skips ``clean_up_tokenization_spaces`` for
BPE models, and with it on for others a delta can differ around " ." or " 's".)

While the window's text ends in U+FFFD the last token(s) hold part of a
multi-byte character (byte-level BPE or byte fallback), so nothing is read
until a later token completes it, or until the request finishes.
"""

from __future__ import annotations

import weakref

from engine.errors import InvalidParameterError

_REPLACEMENT_CHAR = "\ufffd"
# A UTF-8 character has at most 4 bytes and every byte token at least 1, so an
# incomplete character spans at most 3 tokens. An unread run past 8 tokens is
# invalid bytes that will never complete (or tokens without text); it is then
# read up to its last 3 tokens so the window stays short.
_MAX_INCOMPLETE_TOKENS = 3
_MAX_UNREAD_TOKENS = 8
_SKIPPED_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def skipped_special_ids(tokenizer) -> frozenset[int]:
    """The ids the Rust decoder drops with skip_special_tokens (the added tokens marked special),
    worked out once per tokenizer: transformers builds ``added_tokens_decoder`` afresh on each
    read, 13 ms for Gemma 3's 6,384 added tokens, and every request's detokenizer was reading it
    on the engine's thread (a burst of 32 requests: 0.4 s before their first tokens). A
    tokenizer's added tokens do not change once it serves."""
    ids = _SKIPPED_IDS.get(tokenizer)
    if ids is None:
        ids = frozenset(i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special)
        _SKIPPED_IDS[tokenizer] = ids
    return ids


class IncrementalDetokenizer:
    """Turns one request's generated ids into text deltas that are safe to stream.

    The output text is ``decode(output_ids)`` by contract, so the prompt is not
    used as decoding context.

    Cost per ``add_tokens`` is two decodes of a window of a few tokens plus a
    stop-string search over the new text and the ``longest stop - 1``
    characters before it; ``output_text`` joins everything (O(length)), so
    stream with ``get_delta`` and read ``output_text`` once at the end.
    """

    def __init__(self, tokenizer, *, skip_special_tokens: bool = True,
                 stop: tuple[str, ...] = (), include_stop_str_in_output: bool = False):
        stop = tuple(stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise InvalidParameterError("stop", "stop strings must be non-empty strings")
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Exactly the ids the Rust decoder drops with skip_special_tokens; they are
        # dropped here before windowing so a window never starts on a token that
        # decodes to nothing (which would lose a SentencePiece leading space).
        self._skipped_ids = skipped_special_ids(tokenizer) if skip_special_tokens else frozenset()
        self._stop = stop
        self._stop_first_chars = frozenset(s[0] for s in stop)
        self._num_tail_chars = max(map(len, stop), default=1) - 1
        self._include_stop = include_stop_str_in_output

        self._ids: list[int] = []  # output ids minus skipped special tokens
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text: str | None = None  # decode(ids[prefix_offset:read_offset]), cached

        self._emitted: list[str] = []  # every delta returned so far
        self._unemitted = ""  # read text not yet returned: held back, or new since get_delta
        self._tail = ""  # last _num_tail_chars characters of the read text
        self._matched_stop: str | None = None
        self._is_finished = False

    @property
    def output_text(self) -> str:
        """Text so far (read text, held back or not), truncated at a matched stop string."""
        return "".join(self._emitted) + self._unemitted

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended the output, if one did."""
        return self._matched_stop

    def add_tokens(self, token_ids: list[int]) -> str | None:
        """Append newly generated ids; returns the stop string matched (output then ends), else None.

        Ids that arrive after a stop string matched are ignored.
        """
        if self._is_finished:
            raise RuntimeError("add_tokens after get_delta(finished=True)")
        if self._matched_stop is not None:
            return self._matched_stop
        self._ids.extend(i for i in token_ids if i not in self._skipped_ids)
        new_text = self._read(len(self._ids), allow_incomplete=False)
        if new_text is None and len(self._ids) - self._read_offset > _MAX_UNREAD_TOKENS:
            new_text = self._read_invalid_bytes()
        if new_text:
            self._append(new_text)
        return self._matched_stop

    def get_delta(self, finished: bool) -> str:
        """Text produced since the previous call that is safe to emit.

        While not finished, hold back the longest end of the text that is still
        the beginning of a stop string (at most ``longest stop - 1`` characters)
        and any incomplete multi-byte character. When finished (or once a stop
        string matched) release everything, except the stop string itself unless
        ``include_stop_str_in_output``.
        """
        if self._is_finished:
            return ""
        if finished and self._matched_stop is None:
            new_text = self._read(len(self._ids), allow_incomplete=True)
            if new_text:
                self._append(new_text)
        if finished or self._matched_stop is not None:
            num_held = 0
        else:
            num_held = min(self._num_stop_prefix_chars(), len(self._unemitted))
        end = len(self._unemitted) - num_held
        delta, self._unemitted = self._unemitted[:end], self._unemitted[end:]
        if delta:
            self._emitted.append(delta)
        self._is_finished = finished
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def _read(self, end: int, *, allow_incomplete: bool) -> str | None:
        """Text of ids[read_offset:end] and advance the window, or None if not ready."""
        if end <= self._read_offset:
            return None
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        prefix_text = self._prefix_text
        full_text = self._decode(self._ids[self._prefix_offset:end])
        if len(full_text) <= len(prefix_text) and not allow_incomplete:
            return None
        if full_text.endswith(_REPLACEMENT_CHAR) and not allow_incomplete:
            return None
        self._prefix_offset, self._read_offset, self._prefix_text = self._read_offset, end, None
        return full_text[len(prefix_text):]

    def _read_invalid_bytes(self) -> str | None:
        """Read a long run that never formed valid text, keeping its last tokens unread.

        Prefers the latest cut whose text ends on a complete character; if every
        cut ends in U+FFFD the bytes are invalid and are read as U+FFFD.
        """
        last_cut = len(self._ids) - _MAX_INCOMPLETE_TOKENS
        for cut in range(len(self._ids) - 1, last_cut - 1, -1):
            new_text = self._read(cut, allow_incomplete=False)
            if new_text is not None:
                return new_text
        return self._read(last_cut, allow_incomplete=True)

    def _append(self, new_text: str) -> None:
        """Add newly read text, ending the output at the first stop string it completes."""
        if not self._stop:
            self._unemitted += new_text
            return
        # Only a match that ends inside new_text is new: an earlier one would have
        # ended the output already.
        search = self._tail + new_text
        match_end, match_start, match = len(search) + 1, 0, None
        for s in self._stop:
            start = search.find(s, max(0, len(self._tail) - len(s) + 1))
            # The stop string completed first wins (ties: the one that began first),
            # so the result does not depend on how ids are grouped into calls.
            if start >= 0 and (start + len(s), start) < (match_end, match_start):
                match_end, match_start, match = start + len(s), start, s
        if match is None:
            self._unemitted += new_text
            self._tail = search[-self._num_tail_chars:] if self._num_tail_chars else ""
            return
        cut = (match_end if self._include_stop else match_start) - len(self._tail)
        # cut < 0: the stop string began in held-back text, which get_delta never
        # released (see _num_stop_prefix_chars).
        assert len(self._unemitted) + cut >= 0, "part of a stop string was already emitted"
        self._unemitted = (self._unemitted + new_text)[:len(self._unemitted) + cut]
        self._matched_stop = match

    def _num_stop_prefix_chars(self) -> int:
        """Length of the longest end of the read text that a stop string begins with."""
        tail = self._tail
        for i, ch in enumerate(tail):
            if ch in self._stop_first_chars:
                rest = tail[i:]
                if any(s.startswith(rest) for s in self._stop):
                    return len(tail) - i
        return 0
