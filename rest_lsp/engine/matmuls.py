"""The matmul kinds of a lean step (`Matmul.of` picks one per weight) and which of them this machine runs.

Knows torch and our kernels (rest_lsp.kernels), and the memory weights live in (huge_pages); nothing of models: a
weight, its bias, maybe a .gguf's blocks.
"""

# no `from __future__ import annotations`: TorchScript reads the modules' attribute annotations as types
from typing import List, Optional, Union

import torch
import torch.nn.functional as F

from rest_lsp.engine import huge_pages


def onednn_packs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether Matmul can run on oneDNN's packed weights here (CPU, fp32, a torch built with oneDNN)."""
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def panel_packs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether Matmul can run on rest-lsp's own panel kernel here (CPU, fp32, a C compiler: panel_matmul.py)."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    from rest_lsp.kernels import panel_matmul

    return panel_matmul.available()


def fp16_packs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether Matmul can run on fbgemm's fp16 weights here (CPU, fp32 activations, a torch built with fbgemm)."""
    return (device.type == "cpu" and dtype == torch.float32
            and "fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_prepack_fp16")
            and hasattr(torch.ops.quantized, "linear_dynamic_fp16"))


def q8_packs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether Matmul can run on rest-lsp's Q8_0 integer kernel here (CPU, fp32 activations, a C compiler:
    quant_matmul.py)."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    from rest_lsp.kernels import quant_matmul

    return quant_matmul.available()


PACKINGS = ("panel", "onednn", "fp16", "q8", "gguf", "none")
PACK_ROWS = 8  # the input rows oneDNN is told to expect when it picks the weight layout (a tree step's size)


class Matmul(torch.nn.Module):
    """x @ weight.T + bias, on a packed copy of the weight when there is one (`Matmul.of` picks the kind):
    - "panel": rest-lsp's own kernel over fp32 panels (panel_matmul.py; exact: only the accumulation order differs
      from F.linear, and it is the same for any number of rows);
    - "onednn": oneDNN's layout of the fp32 weight (exact: only the accumulation order differs from F.linear);
    - "fp16": fbgemm's fp16 copy, multiplied in fp32 (half the bytes a step streams; the weights round to fp16
      once, so outputs differ from fp32's where the model is near a tie: the "float16-weights" mode);
    - "q8": Q8_0 blocks (a GGUF's own, or the weight quantized to them) on rest-lsp's integer kernel
      (quant_matmul.py; the rows quantized per block of 32, each row's result the same for any number of rows);
    - "gguf": the same kernel on a .gguf's own Q8_0, Q5_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K blocks (panels of
      each format, quant_matmul.FORMATS; `blocks`: one (rows, gguf_blocks.Blocks or None) a fused part), the
      other tensors' weights quantized to Q8_0 as in "q8".
    A module, so that the layer stack can run as TorchScript (`LayerStack`)."""

    packing = "none"

    @staticmethod
    @torch.no_grad()
    def of(weight: torch.Tensor, bias: torch.Tensor | None, pack: str, blocks: list | None = None) -> "Matmul":
        if pack == "panel":
            from rest_lsp.kernels import panel_matmul

            return PanelMatmul(huge_pages.adopt(panel_matmul.pack(weight)), weight.shape[0],
                               None if bias is None else bias.detach().float().contiguous())
        if pack == "onednn":
            return OneDNNMatmul(torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS), bias)
        if pack == "q8":
            from rest_lsp.kernels import quant_matmul

            return QuantMatmul(huge_pages.adopt(quant_matmul.pack(weight)), weight.shape[0],
                               None if bias is None else bias.detach().float().contiguous())
        if pack == "gguf":
            return GgufMatmul.of_blocks(weight, bias, blocks or [(weight.shape[0], None)])
        if pack == "fp16":
            return Fp16Matmul(torch.ops.quantized.linear_prepack_fp16(weight.detach(),
                                                                      None if bias is None else bias.detach()))
        return PlainMatmul(weight, bias)


class PlainMatmul(Matmul):
    bias: Optional[torch.Tensor]

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight, self.bias = weight, bias  # [out, in], [out]: the model's own tensors

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        return F.linear(x, self.weight, self.bias)


class PanelMatmul(Matmul):
    packing = "panel"
    bias: Optional[torch.Tensor]

    def __init__(self, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None):
        from rest_lsp.kernels import step_ops

        super().__init__()
        self.panels, self.out_features, self.bias = panels, out_features, bias  # [N/16, K, 16], N, [N]
        self.step_bias = torch.empty(0) if bias is None else bias  # step_ops' form: no elements for none
        step_ops.ready()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # step_ops' op: the kernel called without leaving TorchScript where it is native
        return torch.ops.rest_lsp_step.panel_mm(x.contiguous(), self.panels, self.out_features, self.step_bias)


class QuantMatmul(Matmul):
    packing = "q8"
    bias: Optional[torch.Tensor]

    def __init__(self, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None, bits: int = 8):
        from rest_lsp.kernels import step_ops

        super().__init__()
        self.step_bias = torch.empty(0) if bias is None else bias  # step_ops' form: no elements for none
        step_ops.ready()
        self.panels, self.out_features, self.bias = panels, out_features, bias  # uint8 [N/16, bytes], N, [N]
        self.bits = bits  # the panels' format code (quant_matmul.FORMATS): 8, 5, 4 the one-scale widths; 41...62

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # step_ops' op: the kernel called without leaving TorchScript where it is native
        return torch.ops.rest_lsp_step.quant_mm(x.contiguous(), self.panels, self.out_features, self.step_bias,
                                                self.bits)


class GgufMatmul(Matmul):
    """A weight whose row ranges run on panels of their own widths (a fused q/k/v whose v is Q8_0 and q, k Q5_0):
    each output column is one part's, computed as that part alone computes it; the parts' outputs side by side."""

    packing = "gguf"

    def __init__(self, parts: List[QuantMatmul]):
        super().__init__()
        self.parts = torch.nn.ModuleList(parts)

    @staticmethod
    @torch.no_grad()
    def of_blocks(weight: torch.Tensor, bias: torch.Tensor | None, blocks: list) -> "GgufMatmul":
        """`blocks`: (rows, gguf_blocks.Blocks or None) for consecutive row ranges of `weight`; None quantizes
        those rows to Q8_0. Neighbouring ranges of one format share a part."""
        from rest_lsp.kernels import quant_matmul

        runs: list[list] = []  # [format code, [fields of each range], first row, rows]
        start = 0
        for rows, found in blocks:
            if found is None:
                q, d = quant_matmul.quantize_q8_0(weight[start : start + rows])
                bits, fields = 8, {"quants": q, "scales": d}
            else:
                bits, fields = found.bits, found.fields()
            if runs and runs[-1][0] == bits:
                runs[-1][1].append(fields)
                runs[-1][3] += rows
            else:
                runs.append([bits, [fields], start, rows])
            start += rows
        if start != weight.shape[0]:
            raise ValueError(f"blocks for {start} rows of a weight of {weight.shape[0]}")
        parts = []
        for bits, ranges, first, rows in runs:
            fields = {name: torch.cat([r[name] for r in ranges]) for name in ranges[0]}
            parts.append(QuantMatmul(huge_pages.adopt(quant_matmul.pack_blocks(**fields, bits=bits)), rows,
                                     None if bias is None else bias[first : first + rows].float().contiguous(), bits))
        return GgufMatmul(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs: List[torch.Tensor] = []
        for part in self.parts:
            outs.append(part(x))
        return outs[0] if len(outs) == 1 else torch.cat(outs, 1)


class OneDNNMatmul(Matmul):
    packing = "onednn"
    bias: Optional[torch.Tensor]

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.packed, self.bias = packed, bias  # oneDNN's layout of the weight, made once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scalars: List[Optional[Union[int, float, complex]]] = []
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", scalars, "")


class Fp16Matmul(Matmul):
    packing = "fp16"

    def __init__(self, packed):
        super().__init__()
        self.packed = packed  # fbgemm's packed fp16 weight (and bias), made once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x.contiguous(), self.packed)


def pick_packing(pack: str | bool | None, dtype: torch.dtype, device: torch.device) -> str:
    """The packing a LeanLlama runs: None picks our panel kernel where it runs, else oneDNN where it packs (True
    asks for oneDNN), False or "none" packs nothing; a packing this machine cannot run is a ValueError."""
    if pack is None:
        return "panel" if panel_packs(dtype, device) else "onednn" if onednn_packs(dtype, device) else "none"
    name = {True: "onednn", False: "none"}.get(pack, pack)
    if name not in PACKINGS:
        raise ValueError(f"unknown packing {pack!r}: use one of {', '.join(PACKINGS)}")
    runs = {"panel": panel_packs, "onednn": onednn_packs, "fp16": fp16_packs, "q8": q8_packs,
            "gguf": q8_packs}.get(name)
    if runs is not None and not runs(dtype, device):
        raise ValueError(f"{name} cannot pack {dtype} weights on {device}")
    return name
