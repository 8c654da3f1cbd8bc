"""Each weight packing's constants reach the decoder that runs on it: the step-cost curve the reference machine
measured (kept as a record: trees are sized by the curve learned here, engine/step_cost.py), how many rows the LM head
takes in one call, and how many rows a node outside it brings (rest_lsp/engine/runmode.py, PACKINGS). The rows hold the numbers the README gives for each kernel."""

import pytest
import torch
from support import tiny_model

from rest_lsp.kernels import panel_matmul
from rest_lsp.engine.decoding import Decoder
from rest_lsp.engine.matmuls import fp16_packs, onednn_packs, q8_packs
from rest_lsp.engine.runmode import PACKINGS

CPU = torch.device("cpu")
RUNS_HERE = {"panel": panel_matmul.available(), "onednn": onednn_packs(torch.float32, CPU),
             "fp16": fp16_packs(torch.float32, CPU), "q8": q8_packs(torch.float32, CPU), "none": True}

# README, "The decoding step": the head batch of each kernel, and the rows a node reached outside it brings.
README = {"panel": (12, 6), "onednn": (8, 4), "fp16": (6, 3), "none": (8, 1)}


# gguf runs a .gguf's own blocks: tests/engine/test_gguf_mode.py loads one and checks its decoder takes gguf's row
@pytest.mark.parametrize("packing", [p for p in PACKINGS if p != "gguf"])
def test_a_decoder_on_each_packing_takes_that_packings_row(packing):
    if not RUNS_HERE[packing]:
        pytest.skip(f"{packing} does not run here")
    decoder = Decoder(tiny_model("llama"), pack=packing)
    assert decoder.lean is not None and decoder.lean.packing == packing
    row = PACKINGS[packing]
    assert decoder.run.step_cost == row.step_cost
    assert (decoder.run.head_batch, decoder.run.miss_rows) == (row.head_batch, row.miss_rows)


def test_the_transformers_engine_takes_the_row_of_the_models_own_matmuls():
    decoder = Decoder(tiny_model("llama"), lean=False)
    row = PACKINGS["none"]
    assert decoder.run.step_cost == row.step_cost and decoder.run.head_batch == row.head_batch
    assert decoder.run.miss_rows == row.miss_rows


@pytest.mark.parametrize("packing", list(README))
def test_each_packings_row_holds_the_readmes_numbers(packing):
    row = PACKINGS[packing]
    assert (row.head_batch, row.miss_rows) == README[packing]
    assert row.step_cost[1] == 1.0 and all(a <= b for a, b in zip(row.step_cost[1:], row.step_cost[2:]))


def test_no_two_packings_share_a_step_cost_curve():
    """A row copied over another would leave the table's shape intact: each kernel's curve is its own."""
    curves = [tuple(PACKINGS[p].step_cost) for p in README]
    assert len(set(curves)) == len(curves)
    # the panel kernel's 12 rows cost about a quarter more than one (README); oneDNN's more, fp16's twice
    assert PACKINGS["panel"].step_cost[12] < PACKINGS["onednn"].step_cost[12] < PACKINGS["fp16"].step_cost[12]
