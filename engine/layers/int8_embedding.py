"""Token embedding read from the LM head's int8 table when the two are tied (SmolLM2, Llama 3.2).

On the CPU's quantized fast path the LM head keeps its weight as int8 codes with one fp16 scale
per 32 columns (engine/kernels/cpu/qmatmul.py's layout, [V / G, H / 32, 8, G, 4] codes + 128 and
[V / G, H / 32, G] scales). A tied embedding then needs no float table of its own: a step's rows
are gathered from the codes and dequantized, a few small ops a step, and the bf16 table (2 bytes
a weight: SmolLM2's is 56.6 MiB) is freed.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.kernels.cpu import qmatmul


class Int8Embedding(nn.Module):
    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("codes", codes, persistent=False)  # the LM head's own tensors
        self.register_buffer("scales", scales, persistent=False)
        self.rows_per_group = codes.shape[3]
        self.embedding_dim = codes.shape[1] * qmatmul.BLOCK
        self.num_embeddings = codes.shape[0] * self.rows_per_group
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, H] in the model's dtype: (q - 128) * d per block of 32. On the CPU one
        native call (step_rows.c, the same bits as ``reference``): the torch ops were ~60 us of
        one stream's step."""
        lib = qmatmul.library()
        if (lib is None or ids.device.type != "cpu" or ids.dtype is not torch.int64 or ids.dim() != 1
                or self.dtype not in (torch.float32, torch.bfloat16) or self.codes.device.type != "cpu"):
            return self.reference(ids)
        ids = ids.contiguous()
        out = torch.empty(ids.shape[0], self.embedding_dim, dtype=self.dtype)
        bad = lib.pagoda_embed_int8(self.codes.data_ptr(), self.scales.data_ptr(), self.rows_per_group,
                                    self.num_embeddings, self.embedding_dim, ids.data_ptr(), ids.shape[0],
                                    out.data_ptr(), int(self.dtype is torch.bfloat16))
        if bad:
            raise IndexError(f"{bad} token ids outside the vocabulary of {self.num_embeddings}")
        return out

    def reference(self, ids: torch.Tensor) -> torch.Tensor:
        """``forward`` in plain torch (any device)."""
        group, lane = ids // self.rows_per_group, ids % self.rows_per_group
        q = self.codes[group, :, :, lane, :]  # [T, H / 32, 8, 4]: column 32 b + 4 s + t
        d = self.scales[group, :, lane]  # [T, H / 32]
        w = (q.float() - 128) * d.float()[..., None, None]
        return w.reshape(ids.shape[0], self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 codes shared with the LM head"
