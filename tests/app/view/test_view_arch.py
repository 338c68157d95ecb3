"""The viewer on a Llama-style run: attention of grouped-query heads, the logit lens and the
neurons of a SwiGLU MLP (the input of mlp.proj), with nothing named after GPT-2."""

from __future__ import annotations

import numpy as np
import pytest
from view_helpers import TEXT

from glassllm.app.config import TrainConfig
from glassllm.app.train import Trainer
from glassllm.app.view import api
from glassllm.app.view.run import Run
from glassllm.autograd import no_grad


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("llama")
    data = out_dir / "data.txt"
    data.write_text(TEXT)
    shape = dict(arch="llama", n_layer=2, n_head=4, n_embd=32, block_size=32, batch_size=4)
    steps = dict(max_iters=4, eval_interval=4, eval_iters=1, sample_tokens=0, stats_interval=0)
    config = TrainConfig(**shape, **steps, data=str(data), out_dir=str(out_dir))
    Trainer(config).fit(progress=False)
    return Run(out_dir)


def test_info_names_the_architecture(run):
    checkpoint = api.info(run, {"brief": "1"})["checkpoint"]
    assert checkpoint["architecture"] == (
        "GPT (2 key/value heads, RMSNorm, SwiGLU, rotary positions)"
    )
    assert checkpoint["model_config"]["positions"] == "rotary"


def test_inspect_attention_lens_and_swiglu_neurons(run):
    answer = api.inspect(run, {"prompt": "def f1(x, y):\n    return"})
    steps = len(answer["tokens"])
    assert answer["logits_diff"] == 0.0 and answer["attention_check"] < 1e-6
    attention = np.array(answer["attention"])
    assert attention.shape == (2, 4, steps, steps)  # every query head, grouped or not
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-5)
    assert answer["mlp"]["activation"] == "silu(gate) × up"
    model = run.model
    hidden = model.config.mlp_size
    assert answer["mlp"]["units"] == hidden
    ids = [t["id"] for t in answer["tokens"]]
    unit = api.neuron(run, {"ids": ids, "layer": 1, "index": hidden - 1})
    block = model.blocks[1]
    with no_grad():  # the unit is silu(gate x) * up x of block 1's normalised input
        x = model.embed(np.array([ids]))
        x = model.blocks[0](x)
        h = block.ln_2(x + block.attn(block.ln_1(x)))  # (1, T, E): what the MLP reads
        gate, up = block.mlp.gate(h).data, block.mlp.up(h).data
    expected = (gate / (1 + np.exp(-gate)) * up)[0, :, hidden - 1]
    np.testing.assert_allclose(unit["values"], expected, atol=1e-4)
    lens = answer["lens"]
    dist = api.distribution(run, {"ids": ids})
    assert lens["top_ids"][-1][-1][0] == int(np.argmax(dist["logits"]))
