"""`python -m engine generate --adapter DIR` prints what the Python API generates under the adapter."""

import pytest

from engine import LLM, LoRARequest, SamplingParams

from tests.engine.lora.adapters import make_adapter
from tests.engine.test_cli import run_cli


@pytest.mark.e2e
def test_generate_under_an_adapter_prints_the_python_apis_text(tiny_llama_dir, tmp_path):
    adapter = make_adapter(tiny_llama_dir, tmp_path / "a", seed=4, r=4, lora_alpha=8,
                           target_modules=["q_proj", "v_proj"])
    proc = run_cli("generate", "--model", str(tiny_llama_dir), "--prompt", "Hello there",
                   "--max-tokens", "12", "--kv-cache-memory-mib", "16", "--adapter", adapter)
    assert proc.returncode == 0, proc.stderr
    llm = LLM(str(tiny_llama_dir), num_kv_blocks=32)
    params = SamplingParams(temperature=0, max_tokens=12)
    expected = llm.generate("Hello there", params, adapters=LoRARequest("cli", adapter))[0].text
    assert proc.stdout == expected + "\n"
    assert expected != llm.generate("Hello there", params)[0].text
