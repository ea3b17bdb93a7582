"""Engines and transformers models on CUDA, built on first use and shared by the GPU tests.

Every engine here gets a fixed, small KV pool (num_kv_blocks), so that several can live in one
process; only test_cuda_memory.py sizes a pool from gpu_memory_utilization.
"""

import copy
import gc

import pytest
import torch

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue, then give one everyday example of the same "
    "effect that a child would understand.",
    "List three prime numbers.",
    "You are reviewing a pull request that renames a function used in forty files. Describe, step "
    "by step, how you would check that nothing broke, which tests you would run first and why, and "
    "what you would write in the review comment.",
]
TINY_PROMPT_LENGTHS = (3, 17, 40, 1, 70, 9)


@pytest.fixture(scope="session")
def model_paths(smollm2_path, tiny_llama_dir):
    return {"smollm2": smollm2_path, "tiny": tiny_llama_dir}


@pytest.fixture(scope="session")
def prompts_for(smollm2_tokenizer):
    """prompts_for(model): a batch of mixed-length prompts as token ids."""
    from engine.text.tokenizer import apply_chat_template

    def get(model: str) -> list[list[int]]:
        if model == "smollm2":
            return [apply_chat_template(smollm2_tokenizer, [{"role": "user", "content": c}])
                    for c in CHATS]
        return [[1 + (i * 37 + j * 11) % 4000 for j in range(n)]
                for i, n in enumerate(TINY_PROMPT_LENGTHS)]

    return get


@pytest.fixture(scope="session")
def cuda_llm(model_paths):
    """cuda_llm(model, dtype, enforce_eager=False): one engine per combination, on cuda."""
    from engine import LLM

    engines = {}

    def get(model: str, dtype: str, enforce_eager: bool = False):
        key = (model, dtype, enforce_eager)
        if key not in engines:
            engines[key] = LLM(str(model_paths[model]), device="cuda", dtype=dtype,
                               num_kv_blocks=512, max_model_len=512, max_num_seqs=16,
                               enforce_eager=enforce_eager)
        return engines[key]

    yield get
    engines.clear()
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(scope="session")
def cuda_hf(model_paths, hf_smollm2):
    """cuda_hf(model, dtype): transformers' own model on cuda, from the float32 weights."""
    from transformers import AutoModelForCausalLM

    models = {}

    def get(model: str, dtype: torch.dtype):
        if (model, dtype) not in models:
            if model == "smollm2":
                cpu = copy.deepcopy(hf_smollm2)  # the session fixture stays on the CPU
            else:
                cpu = AutoModelForCausalLM.from_pretrained(model_paths[model], dtype=torch.float32)
            models[model, dtype] = cpu.to(device="cuda", dtype=dtype).eval()
        return models[model, dtype]

    yield get
    models.clear()
    gc.collect()
    torch.cuda.empty_cache()
