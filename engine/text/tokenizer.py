"""Hugging Face tokenizers for our checkpoints, and chat prompts rendered to token ids."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import transformers

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.errors import InvalidParameterError, ModelLoadError
from engine.models.registry import checkpoint_format, resolve_model_path

logger = logging.getLogger(__name__)
ENGINE_ROOT = Path(__file__).resolve().parent.parent  # the folder that holds the engine package


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer; a GGUF one is converted from the file's metadata once (~4 s on
    CPU) and read back from the cache the conversion left (``gguf_tokenizer_dir``)."""
    path = resolve_model_path(str(path))
    try:
        if checkpoint_format(path) == "gguf":
            cached = gguf_tokenizer_dir(path)
            if cached is not None:
                return AutoTokenizer.from_pretrained(cached)
            return _convert_gguf_tokenizer(path)
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {str(path)!r}: {exc}") from exc


def _convert_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = _gguf_chat_template(path)
    return tokenizer


def _gguf_chat_template(path: Path) -> str | None:
    """The GGUF's own tokenizer.chat_template, None when it carries none (Gemma 3 270M's)."""
    from engine.models.gguf_file import read_header

    return read_header(path).fields.get("tokenizer.chat_template")


def cache_name(path: Path) -> str:
    """The file's name, a digest of its header (the metadata the tokenizer is converted from, not
    the weights) and transformers' version: a changed vocabulary or library converts again, and
    every copy of one file shares one conversion. Named by modification time before, the cache
    grew by a conversion per copy and per upload (830 MB of them on a test machine; Gemma 3's is
    33 MB)."""
    from engine.models.gguf_file import read_header

    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read(read_header(path).data_start)).hexdigest()[:16]
    return f"{path.stem}-{digest}-transformers{transformers.__version__}"


def gguf_tokenizer_dir(path: Path) -> Path | None:
    """A folder holding the GGUF's tokenizer as transformers saves it, converted in a child
    process the first time; None when it cannot be written (then the caller converts in-process).

    Converting in this process costs ~150 MiB of resident memory that stays after the load
    (transformers' GGUF reader and the modules it imports: torch.distributed.tensor, sympy, ...;
    bench/memory.py); reading the saved files back costs ~15. The folder lies under
    $PAGODA_CACHE (default ~/.cache/pagoda)/tokenizers, named by ``cache_name``.
    """
    root = Path(os.environ.get("PAGODA_CACHE") or Path.home() / ".cache" / "pagoda") / "tokenizers"
    out = root / cache_name(path)
    if (out / "tokenizer_config.json").is_file():
        return out
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=root))
    except OSError as exc:
        logger.info("tokenizer cache %s not writable (%s): converting %s in this process", root, exc, path.name)
        return None
    script = ("import sys; from engine.text.tokenizer import _convert_gguf_tokenizer; from pathlib import Path; "
              "_convert_gguf_tokenizer(Path(sys.argv[1])).save_pretrained(sys.argv[2])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ENGINE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        result = subprocess.run([sys.executable, "-c", script, str(path), str(staging)], env=env,
                                capture_output=True, text=True, timeout=600)
        if result.returncode != 0 or not (staging / "tokenizer_config.json").is_file():
            logger.warning("converting the tokenizer of %s in a child process failed (%s): converting "
                           "in this process", path.name, result.stderr.strip()[-500:])
            return None
        try:
            staging.rename(out)
        except OSError:  # another process cached it first
            if not (out / "tokenizer_config.json").is_file():
                raise
        return out
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("caching the tokenizer of %s failed (%s): converting in this process", path.name, exc)
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def apply_chat_template(tokenizer: PreTrainedTokenizerBase, messages: list[dict],
                        add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `messages` rendered with the tokenizer's chat template."""
    if not tokenizer.chat_template:
        raise InvalidParameterError(
            "messages", "this model has no chat template; send a plain prompt instead")
    from jinja2 import TemplateError

    try:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    except TemplateError as exc:  # the template itself rejects e.g. an unknown role
        raise InvalidParameterError("messages", str(exc)) from exc
    # transformers 5 returns a BatchEncoding; older versions a list (nested when batched).
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        if len(ids) != 1:
            raise InvalidParameterError("messages", "expected one conversation, got a batch")
        ids = ids[0]
    return [int(i) for i in ids]
