"""What glassllm cannot compute exactly is refused by name, never ignored: an unknown rope_type
(a hand-edited one, yarn, dynamic), another architecture (Mamba), an inconsistent sliding window,
an unknown activation, a partial rotary where the family has none, quantized weights. Each is
one HFFormatError listing every problem, and the command's one-line error with exit status 2."""

from __future__ import annotations

import json
import shutil

import pytest
from hf_models import Models

from glassllm.app.cli import main
from glassllm.hf import HFFormatError, config_from_hf, load_model


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("hf_refusals"))


def _edited(models: Models, variant: str, tmp_path, edit) -> object:
    directory = tmp_path / variant
    shutil.copytree(models.get(variant), directory)
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _refusal(path) -> str:
    with pytest.raises(HFFormatError) as caught:
        load_model(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_hand_edited_rope_type_is_refused_by_name(models, tmp_path):
    directory = _edited(models, "llama", tmp_path,
                        lambda c: c["rope_parameters"].update(rope_type="nonsense"))  # fmt: skip
    assert "rope_type='nonsense' (glassllm implements default, linear, llama3)" in _refusal(
        directory
    )


@pytest.mark.parametrize("spelling", ["v5", "v4"])
def test_yarn_and_dynamic_scaling_are_refused(models, spelling):
    transformers = models.transformers
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    directory = models.root / f"yarn_{spelling}"
    if not directory.exists():
        config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=128,
                                          vocab_size=300, max_position_embeddings=64,
                                          rope_parameters={**yarn, "rope_theta": 1e4})  # fmt: skip
        transformers.LlamaForCausalLM(config).save_pretrained(directory)
    if spelling == "v4":
        config = json.loads((directory / "config.json").read_text())
        config.pop("rope_parameters")
        config.update(rope_theta=1e4, rope_scaling={"type": "dynamic", "factor": 2.0})
        (directory / "config.json").write_text(json.dumps(config))
        assert "rope_scaling.rope_type='dynamic'" in _refusal(directory)
    else:
        assert "rope_parameters.rope_type='yarn'" in _refusal(directory)


def test_another_architecture_is_refused_by_name(models):
    transformers = models.transformers
    directory = models.root / "mamba"
    config = transformers.MambaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2)
    transformers.MambaForCausalLM(config).save_pretrained(directory)
    message = _refusal(directory)
    assert "it holds a 'mamba' model; glassllm loads model_type 'gpt2', 'llama'" in message


def test_sliding_layers_without_a_window_are_refused(models, tmp_path):
    def edit(config):
        config["layer_types"] = ["full_attention", "sliding_attention"]  # use_sliding_window false

    directory = _edited(models, "qwen2", tmp_path, edit)
    assert "sliding_attention layers but use_sliding_window is false" in _refusal(directory)


def test_every_problem_is_listed_at_once(models, tmp_path):
    def edit(config):
        config.update(hidden_act="gelu", partial_rotary_factor=0.5, num_key_value_heads=3,
                      quantization_config={"quant_method": "gptq"})  # fmt: skip
        config["rope_parameters"].update(rope_type="llama3", factor=8.0, mscale=1.0,
                                         low_freq_factor=4.0, high_freq_factor=1.0)  # fmt: skip

    message = _refusal(_edited(models, "llama", tmp_path, edit))
    parts = ("hidden_act='gelu' (a SwiGLU MLP needs silu or swish)", "rotates 8 of 16 features",
             "num_key_value_heads=3 (must divide", "quantization_config", "keys ['mscale']",
             "low_freq_factor=4.0 must be below")  # fmt: skip
    for part in parts:
        assert part in message, part


def test_the_command_says_one_line_and_exits_2(models, tmp_path, capsys):
    sparse = [[["global", "sparse"], 1]]
    directory = _edited(models, "gpt_neo", tmp_path, lambda c: c.update(attention_types=sparse))
    capsys.readouterr()  # transformers' progress bars while the fixture was built
    status = main(["sample", "--checkpoint", str(directory), "--max-new-tokens", "2"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("glassllm: error: "), lines
    assert "attention_types" in lines[0]


@pytest.mark.parametrize(
    "changes, fragment",
    [({"attention_types": [[["global"], 10**9]]}, "attention_types"),
     ({"num_layers": 10**8}, "num_layers=100000000"),
     ({"window_size": 0}, "window_size=0"),
     ({"max_position_embeddings": 2**30}, "max_position_embeddings")],
)  # fmt: skip
def test_bounds_are_checked_before_anything_is_sized(changes, fragment):
    hf = {"model_type": "gpt_neo", "num_layers": 2, **changes}
    with pytest.raises(HFFormatError, match=fragment):
        config_from_hf(hf)
