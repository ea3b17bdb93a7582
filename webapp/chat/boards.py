"""Which answer board this process uses: chosen once for the REDIS_URL setting, as
``get_limit_store`` chooses the limit store. A ``LocalAnswerBoard`` (chat.board) in embedded mode,
a ``RedisAnswerBoard`` (chat.relay) in distributed mode; chat's sockets and pages get it here."""

from __future__ import annotations

import functools
import threading

from django.conf import settings

from webapp.chat.board import AnswerBoard, LocalAnswerBoard
from webapp.chat.relay import RedisAnswerBoard

_board_lock = threading.Lock()  # one board per process: a socket and a page must see the same one


@functools.lru_cache(maxsize=1)
def _board_for(url: str | None) -> AnswerBoard:
    return RedisAnswerBoard(url) if url else LocalAnswerBoard()


def get_answer_board() -> AnswerBoard:
    """The process-wide board for the current REDIS_URL setting (re-made if the setting changes)."""
    with _board_lock:
        return _board_for(getattr(settings, "REDIS_URL", None))
