"""The web side's share of a model at start-up: each active version's tokenizer loaded and its chat
template compiled, so that the first request does not pay for them.

Without it the first chat request after `make run` spent 172 ms preparing (Server-Timing
``prepare``) against 12 ms for the next: the tokenizer is loaded and the template compiled once per
process (registry/tokenizers.py caches both). The embedded server calls it in its start-up thread
(registry/embedded.py), after handing the versions to their workers; a web server whose workers
run elsewhere (`make stack`'s and docker-compose's Daphne processes, started with
PAGODA_WARM_TOKENIZERS=1: RegistryConfig.ready()) in a thread of its own.
"""

from __future__ import annotations

import logging
import time

from webapp.config.after_ready import when_apps_ready
from webapp.registry.selectors import modelversion_list_active, modelversion_tokenizer

logger = logging.getLogger(__name__)

HELLO = [{"role": "user", "content": "Hello."}]


def warm_tokenizers_when_ready() -> None:
    when_apps_ready(warm_tokenizers, "warming the tokenizers at start-up", "pagoda-warm-tokenizers")


def warm_tokenizers() -> int:
    """Load every active version's tokenizer and render a chat with it where it has a template;
    returns how many were loaded. A version that fails is logged and skipped (its first request
    will say what is wrong)."""
    loaded = 0
    for version in modelversion_list_active():
        if not version.tokenizer_dir:  # still being exported
            continue
        start = time.perf_counter()
        try:
            tokenizer = modelversion_tokenizer(version)
            if tokenizer.embedding is None and tokenizer.chat_template:
                tokenizer.apply_chat_template(HELLO)
        except Exception:
            logger.warning("could not warm the tokenizer of %s", version, exc_info=True)
            continue
        loaded += 1
        logger.info("tokenizer of %s ready in %.0f ms", version, (time.perf_counter() - start) * 1000)
    return loaded
