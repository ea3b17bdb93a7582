"""Hugging Face checkpoint directories: config.json and *.safetensors shards, float or quantized
(Pagoda's converted layout, GPTQ, AWQ: engine/quantization/checkpoints.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.errors import ModelLoadError
from engine.layers.rope_scaling import ROPE_TYPES
from engine.models.model_config import ModelConfig
from engine.models.registry import ENCODER_FAMILIES, supported_architecture
from engine.quantization import checkpoints

INDEX_FILE = "model.safetensors.index.json"
LM_HEAD = "lm_head.weight"
# Buffers some old checkpoints saved that the model recomputes.
SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {str(path)!r}: {exc}") from exc


def _token_ids(value) -> list[int]:
    """config `eos_token_id` may be null, an int or a list of ints."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _tokenizer_eos_id(directory: Path) -> int | None:
    """The id of tokenizer_config.json's eos_token, looked up in tokenizer.json (no tokenizer load)."""
    config_file, tokenizer_file = directory / "tokenizer_config.json", directory / "tokenizer.json"
    if not (config_file.is_file() and tokenizer_file.is_file()):
        return None
    eos = _read_json(config_file).get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not isinstance(eos, str):
        return None
    tokenizer = _read_json(tokenizer_file)
    for added in tokenizer.get("added_tokens", []):
        if added.get("content") == eos:
            return int(added["id"])
    vocab = (tokenizer.get("model") or {}).get("vocab")
    return vocab.get(eos) if isinstance(vocab, dict) else None


def _rope(config: dict, layer_type: str | None = None) -> tuple[float, dict | None]:
    """rope_theta and rope_scaling in HF form, from either the v4 keys or v5 `rope_parameters`
    (per layer type for Gemma 3: {"full_attention": {...}, "sliding_attention": {...}})."""
    parameters = dict(config.get("rope_parameters") or {})
    if layer_type is not None and isinstance(parameters.get(layer_type), dict):
        parameters = dict(parameters[layer_type])
        scaling = {} if layer_type != "full_attention" else dict(config.get("rope_scaling") or {})
        theta = parameters.get("rope_theta", config.get("rope_theta", 10000.0))
    else:
        theta = config.get("rope_theta", parameters.get("rope_theta", 10000.0))
        scaling = dict(config.get("rope_scaling") or {})
    if not scaling:
        scaling = {k: v for k, v in parameters.items() if k != "rope_theta"}
    legacy_type = scaling.pop("type", None)
    scaling.setdefault("rope_type", legacy_type or "default")
    if scaling["rope_type"] == "su":  # Phi-3's first name for longrope
        scaling["rope_type"] = "longrope"
    scaling.pop("rope_theta", None)
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelLoadError(f"partial rotary embeddings ({scaling['partial_rotary_factor']}) "
                             f"are not supported")
    scaling.pop("partial_rotary_factor", None)
    if scaling["rope_type"] not in ROPE_TYPES:
        raise ModelLoadError(f"unsupported rope_scaling type {scaling['rope_type']!r}; "
                             f"supported: {', '.join(ROPE_TYPES)}")
    if scaling["rope_type"] == "default":
        return float(theta), None
    if scaling["rope_type"] in ("yarn", "longrope", "dynamic"):
        # yarn / longrope: the pre-training context, from rope_scaling or (Phi-3) the config;
        # dynamic scales from max_position_embeddings on (transformers' rule).
        scaling.setdefault("original_max_position_embeddings", config.get(
            "original_max_position_embeddings", config.get("max_position_embeddings", 2048)))
        if scaling["rope_type"] == "dynamic":
            scaling["original_max_position_embeddings"] = config.get("max_position_embeddings", 2048)
    return float(theta), scaling


def _max_positions(config: dict, rope_scaling: dict | None) -> int:
    """The context length: dynamic NTK stretches max_position_embeddings by its factor."""
    max_positions = config.get("max_position_embeddings", 2048)
    if rope_scaling and rope_scaling["rope_type"] == "dynamic":
        return int(max_positions * rope_scaling["factor"])
    return max_positions


def _family_fields(architecture: str, config: dict) -> dict:
    """ModelConfig fields beyond Llama's, per family; ModelLoadError for what we do not run."""
    layers = config["num_hidden_layers"]
    activation = config.get("hidden_activation" if architecture == "gemma3" else "hidden_act")
    expected = "gelu_pytorch_tanh" if architecture == "gemma3" else "silu"
    if activation not in (None, expected):
        raise ModelLoadError(f"{architecture} with activation {activation!r} is not supported "
                             f"(only {expected!r})")
    fields: dict = {}
    window = config.get("sliding_window")
    types = config.get("layer_types") or []
    if architecture in ("qwen3", "qwen3_moe"):
        fields["qk_norm"] = True
        if architecture == "qwen3_moe":
            fields.update(_moe_fields(config))
        if window and config.get("use_sliding_window"):
            fields["layer_sliding_windows"] = [window if t == "sliding_attention" else None
                                               for t in types] or [window] * layers
    elif architecture == "phi3":
        if window:
            fields["layer_sliding_windows"] = [window] * layers
    elif architecture == "gemma3":
        if config.get("attn_logit_softcapping"):
            raise ModelLoadError("Gemma attention logit soft-capping is not supported")
        if config.get("use_bidirectional_attention"):
            raise ModelLoadError("Gemma bidirectional attention is not supported")
        if not types:
            pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                     for i in range(layers)]
        if isinstance((config.get("rope_parameters") or {}).get("sliding_attention"), dict):
            local_theta, local_scaling = _rope(config, "sliding_attention")  # transformers v5
        else:
            local_theta, local_scaling = float(config.get("rope_local_base_freq", 10000.0)), None
        if local_scaling is not None:
            raise ModelLoadError("Gemma 3 RoPE scaling on its sliding-window layers is not supported")
        fields.update(
            qk_norm=True, local_rope_theta=local_theta,
            layer_sliding_windows=[window if t == "sliding_attention" else None for t in types],
            query_pre_attn_scalar=config.get("query_pre_attn_scalar", 256),
            final_logit_softcapping=config.get("final_logit_softcapping"))
    return fields


def _moe_fields(config: dict) -> dict:
    """Qwen3-MoE: a layer's MLP is sparse unless listed in mlp_only_layers or off the
    decoder_sparse_step (transformers' rule)."""
    experts = config.get("num_experts", config.get("num_local_experts", 0))
    step, dense = config.get("decoder_sparse_step", 1), set(config.get("mlp_only_layers") or [])
    return dict(num_experts=experts, num_experts_per_tok=config["num_experts_per_tok"],
                moe_intermediate_size=config["moe_intermediate_size"],
                norm_topk_prob=bool(config.get("norm_topk_prob", False)),
                moe_layers=[i not in dense and experts > 0 and (i + 1) % step == 0
                            for i in range(config["num_hidden_layers"])])


def weight_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> shard file, from the index json when there is one, else every shard's header."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map") or {}
        return {name: directory / file for name, file in weight_map.items()}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"model directory {str(directory)!r} contains no *.safetensors weights")
    names: dict[str, Path] = {}
    for file in files:
        with safe_open(file, framework="pt") as shard:
            names.update((name, file) for name in shard.keys())
    return names


def load_hf_config(directory: Path) -> ModelConfig:
    config = _read_json(directory / "config.json")
    generation_file = directory / "generation_config.json"
    generation = _read_json(generation_file) if generation_file.is_file() else {}
    architecture_name = (config.get("architectures") or [config.get("model_type")])[0]
    architecture = supported_architecture(
        architecture_name, where=str(directory / "config.json"))
    if architecture in ENCODER_FAMILIES:
        raise ModelLoadError(f"{str(directory)!r} is an embedding model ({architecture}): it serves "
                             f"embeddings (engine.embedding_engine.EmbeddingEngine), not generation")
    if config.get("mlp_bias"):
        raise ModelLoadError(f"{str(directory)!r}: mlp_bias=true is not supported")

    names = weight_files(directory)
    if "model.layers.0.self_attn.o_proj.bias" in names:
        # ModelConfig.attention_bias covers q/k/v (Qwen2); Llama's attention_bias also biases o_proj.
        raise ModelLoadError(f"{str(directory)!r}: an o_proj bias is not supported")
    hidden_size = config["hidden_size"]
    num_heads = config["num_attention_heads"]
    rope_theta, rope_scaling = _rope(config, "full_attention" if architecture == "gemma3" else None)
    max_positions = _max_positions(config, rope_scaling)
    # Mistral/Qwen2 sliding-window attention equals full attention while the sequence fits the
    # window, so limiting the context to the window keeps full attention exact.
    window = config.get("sliding_window")
    if window and architecture in ("mistral", "qwen2") and config.get(
            "use_sliding_window", architecture == "mistral"):
        max_positions = min(max_positions, window)

    eos_ids = _token_ids(config.get("eos_token_id")) + _token_ids(generation.get("eos_token_id"))
    tokenizer_eos = _tokenizer_eos_id(directory)
    if tokenizer_eos is not None:
        eos_ids.append(tokenizer_eos)
    bos = config.get("bos_token_id", generation.get("bos_token_id"))
    try:
        return ModelConfig(
            architecture=architecture,
            vocab_size=config["vocab_size"],
            hidden_size=hidden_size,
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or hidden_size // num_heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings")) or LM_HEAD not in names,
            attention_bias=any(f"model.layers.0.self_attn.{p}.bias" in names
                               for p in ("q_proj", "qkv_proj")),
            bos_token_id=bos,
            eos_token_ids=list(dict.fromkeys(eos_ids)),
            torch_dtype=config.get("dtype") or config.get("torch_dtype"),
            **_family_fields(architecture, config),
        )
    except KeyError as exc:
        raise ModelLoadError(f"{str(directory / 'config.json')!r} lacks {exc.args[0]!r}") from exc
    except ValueError as exc:
        raise ModelLoadError(f"{str(directory / 'config.json')!r}: {exc}") from exc


class SafetensorsWeights:
    """Tensors of a safetensors checkpoint, read one at a time from memory-mapped shards. A
    quantized projection's stored parts (qweight, scales, ...) come out as one Int4Weight /
    Int8Weight named ``<projection>.weight``."""

    def __init__(self, directory: Path, config: ModelConfig):
        names = weight_files(directory)
        self._quant = _read_json(directory / "config.json").get("quantization_config") or {}
        try:
            self._method = checkpoints.method_of(self._quant)
        except ValueError as exc:
            raise ModelLoadError(f"{str(directory)!r}: {exc}") from exc
        skip = {LM_HEAD} if config.tie_word_embeddings else set()
        parts = checkpoints.PARTS.get(self._method, ())
        quantized = {n.removesuffix(".qweight") for n in names if parts and n.endswith(".qweight")}
        self._by_file: dict[Path, list[str]] = {}
        for name, file in names.items():
            prefix, _, suffix = name.rpartition(".")
            if name in skip or name.endswith(SKIPPED_SUFFIXES):
                continue
            if prefix in quantized and suffix in parts and suffix != "qweight":
                continue  # read with its qweight
            self._by_file.setdefault(file, []).append(name)
        self._names = names
        self._quantized = quantized
        self._count = sum(len(v) for v in self._by_file.values())

    def __len__(self) -> int:
        return self._count

    def native_layouts(self) -> dict[str, tuple]:
        """HF weight name -> ("int4", group) / ("int8", None) of each quantized projection."""
        layouts = {}
        for prefix in self._quantized:
            if self._method == checkpoints.PAGODA and self._quant.get("bits") == 8:
                layouts[f"{prefix}.weight"] = ("int8", None)
                continue
            scales, qweight = self._shape(f"{prefix}.scales"), self._shape(f"{prefix}.qweight")
            groups, in_features = {checkpoints.PAGODA: (scales[1], qweight[1] * 2),  # [N, K / G]
                                   "gptq": (scales[0], qweight[0] * 8)  # [K / G, N], [K / 8, N]
                                   }.get(self._method, (scales[0], qweight[0]))  # AWQ: [K, N / 8]
            group = in_features // groups
            if group in checkpoints.GROUP_SIZES:
                layouts[f"{prefix}.weight"] = ("int4", group)
        return layouts

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for file, names in self._by_file.items():
            with safe_open(file, framework="pt") as shard:
                for name in names:
                    prefix = name.removesuffix(".qweight")
                    if prefix not in self._quantized:
                        yield name, shard.get_tensor(name)
                        continue
                    yield f"{prefix}.weight", self._read_projection(prefix)

    def iterate(self, keep_quantized: frozenset[str] = frozenset()):
        return iter(self)  # quantized projections always come quantized (there is no float copy)

    def _shape(self, name: str) -> list[int]:
        with safe_open(self._names[name], framework="pt") as shard:
            return shard.get_slice(name).get_shape()

    def _read_projection(self, prefix: str):
        parts = {}
        for part in checkpoints.PARTS[self._method]:
            name = f"{prefix}.{part}"
            if name in self._names:
                with safe_open(self._names[name], framework="pt") as shard:
                    parts[part] = shard.get_tensor(name)
        try:
            return checkpoints.read_projection(self._method, parts, self._quant)
        except ValueError as exc:
            raise ModelLoadError(f"{prefix}: {exc}") from exc
