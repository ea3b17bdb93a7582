"""Check that a checkpoint can be served, reporting progress as JSON lines on stdout.

    python -m engine.cli.validate MODEL_PATH [--convert-dtype float16|bfloat16|float32]

With --convert-dtype the checkpoint's safetensors shards are first rewritten in that dtype
(engine/cli/convert.py), so the checks and the recorded size are those of the converted files.
Each line is ``{"step": "...", "progress": 0..1}``; the last is either
``{"ok": true, "parameters": N, "context_length": L, "size_bytes": B, "checksum": "<sha256>",
"chat_template": bool, "facts": {...}, "summary": "gemma3, context 32768, ..."}``
(an embedding model's adds ``"embedding"``: engine/cli/validate_embedding.py)
or ``{"ok": false, "error": "..."}``. The exit status is 0 exactly when the checkpoint is ok.
The web process runs this as a child so that it never imports torch itself.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from engine.errors import EngineError
from engine.models.model_config import ModelConfig

FORWARD_TOKENS = 4
HASH_CHUNK = 1 << 20

Report = Callable[[str, float], None]


def check_weights(path: Path, config: ModelConfig, report: Report) -> int:
    """Every tensor has a place of its shape in the family's model and none is missing (the
    model built on the meta device, so nothing is allocated); returns the element count."""
    import torch

    from engine.layers.linear import ShapeMismatchError
    from engine.models.loader import iter_weights, load_weights
    from engine.models.registry import model_class

    with torch.device("meta"):
        model = model_class(config.architecture)(config)
    weights = iter_weights(path, config)
    total, count, last = max(1, len(weights)), [0, 0], [""]

    def counted():
        for name, tensor in weights:
            last[0] = name
            count[0] += 1
            count[1] += tensor.numel()
            if count[0] * 20 // total != (count[0] - 1) * 20 // total:  # about 20 progress lines
                report("checking tensor shapes", count[0] / total)
            yield name, tensor

    try:
        load_weights(model, counted())
    except KeyError as exc:  # a tensor without a place, or places without a tensor
        raise EngineError(f"{exc.args[0]} (a {config.architecture} model)") from exc
    except ValueError as exc:  # load_weights names the tensor; a whole one's shapes are named here
        if isinstance(exc.__cause__, ShapeMismatchError):
            raise EngineError(f"tensor {last[0]!r} has shape {exc.__cause__.loaded} but config.json "
                              f"implies {exc.__cause__.expected}") from exc
        raise
    return count[1]


def checkpoint_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def checksum(path: Path) -> tuple[str, int]:
    """sha256 over each file's relative name and bytes, in name order; and the total size."""
    digest, size = hashlib.sha256(), 0
    for file in checkpoint_files(path):
        digest.update(str(file.relative_to(path.parent if path.is_file() else path)).encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
                size += len(chunk)
    return digest.hexdigest(), size


def validate(model_path: str | Path, report: Report) -> dict:
    """The checks in order; raises EngineError (or ValueError/KeyError from the loaders) on failure."""
    from engine.llm import LLM
    from engine.memory.estimate import estimate_memory
    from engine.memory.model_facts import model_facts
    from engine.models.loader import load_model_config
    from engine.models.registry import is_embedding_checkpoint, resolve_model_path
    from engine.sampling_params import SamplingParams
    from engine.text.tokenizer import load_tokenizer

    path = resolve_model_path(str(model_path))
    if is_embedding_checkpoint(path):
        from engine.cli.validate_embedding import validate_embedding
        fields = validate_embedding(path, report)
        report("computing checksum", 0.9)
        digest, size = checksum(path)
        report("done", 1.0)
        return {"ok": True, **fields, "size_bytes": size, "checksum": digest}
    report("reading config", 0.0)
    facts = model_facts(str(path))  # the family, and a GGUF's bytes and shapes against its metadata
    config = load_model_config(path)  # also refuses unsupported architectures
    report("loading tokenizer", 0.05)
    tokenizer = load_tokenizer(path)
    if tokenizer.chat_template:  # without one the model serves completions (staff may set one)
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                      add_generation_prompt=True)
    num_parameters = check_weights(path, config, lambda step, p: report(step, 0.1 + 0.6 * p))
    report("running a forward pass", 0.7)
    llm = LLM(str(path), num_kv_blocks=4, max_model_len=64, enable_prefix_caching=False)
    out = llm.generate("Hello", SamplingParams(max_tokens=FORWARD_TOKENS, temperature=0.0,
                                               ignore_eos=True))[0]
    if len(out.token_ids) != FORWARD_TOKENS:
        raise EngineError(f"the forward pass produced {len(out.token_ids)} tokens, "
                          f"expected {FORWARD_TOKENS}")
    report("computing checksum", 0.9)
    digest, size = checksum(path)
    report("done", 1.0)
    return {"ok": True, "parameters": num_parameters, "context_length": config.max_position_embeddings,
            "size_bytes": size, "checksum": digest, "chat_template": bool(tokenizer.chat_template),
            "facts": facts.as_dict(), "summary": facts.describe(),
            "memory": estimate_memory(str(path)).describe()}


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from engine.cli.convert import DTYPES, convert_checkpoint

    parser = argparse.ArgumentParser(prog="python -m engine.cli.validate", description=__doc__.split("\n")[0])
    parser.add_argument("model_path")
    parser.add_argument("--convert-dtype", choices=DTYPES, default=None,
                        help="rewrite the safetensors shards in this dtype before validating")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def report(step: str, p: float) -> None:
        _emit({"step": step, "progress": round(p, 4)})

    try:
        if args.convert_dtype:  # conversion is the first tenth of the progress bar
            convert_checkpoint(args.model_path, args.convert_dtype, lambda step, p: report(step, 0.1 * p))
            result = validate(args.model_path, lambda step, p: report(step, 0.1 + 0.9 * p))
        else:
            result = validate(args.model_path, report)
    except (EngineError, ValueError, KeyError, OSError) as exc:
        _emit({"ok": False, "error": str(exc)})
        return 1
    if args.convert_dtype:
        result["dtype"] = args.convert_dtype
    _emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
