"""The workers' message contract carries a request's LoRA adapter (its name and folder), both or
neither; the worker turns it into the engine's LoRARequest."""

import pytest

from workers.protocol import GenerateRequest, ProtocolError


def test_generate_request_carries_the_adapter_through_json():
    req = GenerateRequest("r1", "tiny", [1, 2, 3], {}, adapter="terse", adapter_path="/m/adapters/tiny/terse-1")
    back = GenerateRequest.from_dict(req.to_dict())
    assert (back.adapter, back.adapter_path) == ("terse", "/m/adapters/tiny/terse-1")
    plain = GenerateRequest.from_dict(GenerateRequest("r2", "tiny", [1], {}).to_dict())
    assert (plain.adapter, plain.adapter_path) == ("", "")


@pytest.mark.parametrize("fields", [{"adapter": "terse"}, {"adapter_path": "/x"}, {"adapter": 3, "adapter_path": "/x"}])
def test_an_adapter_without_its_folder_or_a_folder_without_its_name_is_refused(fields):
    data = {**GenerateRequest("r1", "tiny", [1], {}).to_dict(), **fields}
    with pytest.raises(ProtocolError, match="adapter"):
        GenerateRequest.from_dict(data)
