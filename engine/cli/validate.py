"""Check that a checkpoint can be served, reporting progress as JSON lines on stdout.

    python -m engine.cli.validate MODEL_PATH [--convert-dtype float16|bfloat16|float32]

With --convert-dtype the checkpoint's safetensors shards are first rewritten in that dtype
(engine/cli/convert.py), so the checks and the recorded size are those of the converted files.
Each line is ``{"step": "...", "progress": 0..1}``; the last is either
``{"ok": true, "parameters": N, "context_length": L, "size_bytes": B, "checksum": "<sha256>"}``
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


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape the config implies (before Q/K/V and gate/up fusion)."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
        if config.qk_norm:  # Qwen3, Gemma 3
            shapes.update({p + "self_attn.q_norm.weight": (config.head_dim,),
                           p + "self_attn.k_norm.weight": (config.head_dim,)})
        if config.architecture == "gemma3":  # a norm before and after each sublayer
            shapes.update({p + "pre_feedforward_layernorm.weight": (h,),
                           p + "post_feedforward_layernorm.weight": (h,)})
        if config.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
    return shapes


def check_weights(path: Path, config: ModelConfig, report: Report) -> int:
    """Every tensor has the shape the config implies and none is missing; returns the element count."""
    from engine.models.loader import iter_weights

    expected = expected_shapes(config)
    weights = iter_weights(path, config)
    total, num_parameters, seen = max(1, len(weights)), 0, set()
    for done, (name, tensor) in enumerate(weights, start=1):
        if "rotary_emb.inv_freq" in name:
            continue
        if name not in expected:
            raise EngineError(f"tensor {name!r} has no place in a {config.architecture} model")
        if tuple(tensor.shape) != expected[name]:
            raise EngineError(f"tensor {name!r} has shape {tuple(tensor.shape)} but config.json "
                              f"implies {expected[name]}")
        seen.add(name)
        num_parameters += tensor.numel()
        if done * 20 // total != (done - 1) * 20 // total:  # about 20 progress lines, not one per tensor
            report("checking tensor shapes", done / total)
    missing = sorted(set(expected) - seen)
    if missing:
        raise EngineError(f"checkpoint lacks tensors: {missing[:8]}")
    return num_parameters


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
    from engine.models.loader import load_model_config
    from engine.models.registry import resolve_model_path
    from engine.sampling_params import SamplingParams
    from engine.text.tokenizer import load_tokenizer

    path = resolve_model_path(str(model_path))
    report("reading config", 0.0)
    config = load_model_config(path)  # also refuses unsupported architectures
    report("loading tokenizer", 0.05)
    tokenizer = load_tokenizer(path)
    if tokenizer.chat_template:  # a base model without one serves text completions
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
            **describe(path, config)}


def describe(path: Path, config: ModelConfig) -> dict:
    """What the console shows of a validated checkpoint: its architecture, layers, attention
    pattern and (GGUF) the block types of its weights, most common first."""
    windows = [w for w in config.layer_sliding_windows if w]
    attention = (f"{len(windows)} sliding-window ({max(windows)}) + "
                 f"{config.num_hidden_layers - len(windows)} global layers" if windows else "full attention")
    out = {"architecture": config.architecture, "layers": config.num_hidden_layers, "attention": attention}
    if path.is_file() and path.suffix == ".gguf":
        from collections import Counter

        from gguf import GGUFReader
        kinds = Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors if len(t.shape) == 2)
        out["quantization"] = " ".join(f"{kind} x{n}" for kind, n in kinds.most_common())
    return out


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
