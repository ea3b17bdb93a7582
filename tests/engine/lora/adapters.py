"""Tiny random Llama checkpoints and PEFT LoRA adapters for them, made by peft itself (B drawn
non-zero, so an adapter changes the tokens)."""

from __future__ import annotations

import torch

# Two adapters of different rank, scale rule and targets.
ADAPTERS = {
    "terse": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
    "chatty": dict(r=8, lora_alpha=16, use_rslora=True,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                   "down_proj"]),
}


def make_adapter(base_dir, out_dir, *, seed: int, model=None, b_std: float = 0.1, **lora):
    """Save a PEFT LoRA adapter for the checkpoint in ``base_dir`` (or for ``model``, which it
    then wraps in place) to ``out_dir``; returns the folder."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = model if model is not None else AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, LoraConfig(init_lora_weights=False, **lora))
    with torch.no_grad():  # B ~ N(0, b_std): 0.1 moves a tiny model's logits by a few units
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, b_std)
    peft_model.save_pretrained(out_dir)
    return str(out_dir)


def merged_reference(base_dir, adapter_dir):
    """peft's merged model (fp32): the reference an adapter's tokens must equal."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(model, adapter_dir).merge_and_unload().eval()
