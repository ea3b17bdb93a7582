"""Weight-only int8/int4 quantization: modules, a pass over a built model, GGUF block import."""

from engine.quantization.int4 import Int4WeightOnlyLinear, dequantize_int4, quantize_int4
from engine.quantization.int8 import Int8WeightOnlyLinear, dequantize_int8, quantize_int8
from engine.quantization.passes import quantize_model

__all__ = ["Int4WeightOnlyLinear", "Int8WeightOnlyLinear", "dequantize_int4", "dequantize_int8",
           "quantize_int4", "quantize_int8", "quantize_model"]
