"""gated_linear_units: BERT's feed-forward becomes act(gate(x)) * dense(x), and trains."""

import sys

import pytest
import torch
from torch import nn

from trainkit.algorithms import (
    GatedIntermediate,
    GatedLinearUnits,
    GatedLinearUnitsConfig,
    apply_gated_linear_units,
)
from trainkit.core import plugins
from trainkit.trainer import HuggingFaceModel, Trainer

transformers = pytest.importorskip("transformers")


def bert_config():
    return transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def bert():
    torch.manual_seed(0)
    return transformers.BertModel(bert_config()).eval()


def test_replaces_every_feed_forward_with_a_glu_and_keeps_shapes():
    model = bert()
    ids = torch.randint(0, 50, (2, 8))
    shape = model(input_ids=ids).last_hidden_state.shape
    dense = model.encoder.layer[0].intermediate.dense
    replaced = apply_gated_linear_units(model)
    assert sorted(replaced) == ["encoder.layer.0.intermediate", "encoder.layer.1.intermediate"]
    glu = model.encoder.layer[0].intermediate
    assert isinstance(glu, GatedIntermediate) and glu.dense is dense
    assert glu.gate.bias is None
    x = torch.randn(2, 8, 16)
    expected = nn.functional.gelu(glu.gate(x)) * dense(x)
    torch.testing.assert_close(glu(x), expected)
    assert model(input_ids=ids).last_hidden_state.shape == shape


def test_act_fn_and_bias_options():
    model = bert()
    apply_gated_linear_units(model, act_fn="silu", gated_layer_bias=True)
    glu = model.encoder.layer[1].intermediate
    x = torch.randn(3, 16)
    torch.testing.assert_close(glu(x), nn.functional.silu(glu.gate(x)) * glu.dense(x))
    assert glu.gate.bias is not None


def test_through_the_trainer_the_gates_train():
    torch.manual_seed(0)
    model = HuggingFaceModel(transformers.BertForMaskedLM(bert_config()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 50, (4, 8))
    batches = [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}] * 2
    trainer = Trainer(
        model=model,
        train_dataloader=batches,
        optimizers=optimizer,
        max_duration="2ba",
        algorithms=[GatedLinearUnits()],
        progress_bar=False,
        device="cpu",
    )
    gate = trainer.state.model.model.bert.encoder.layer[0].intermediate.gate.weight
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert id(gate) in held and held == {id(p) for p in trainer.state.model.parameters()}
    before = gate.detach().clone()
    trainer.fit()
    assert not torch.equal(gate, before)


def test_warns_on_a_model_without_bert_feed_forward():
    with pytest.warns(UserWarning, match="gated_linear_units matched no module"):
        apply_gated_linear_units(nn.Sequential(nn.Linear(2, 2)))


def test_refuses_an_intermediate_whose_attributes_changed():
    model = bert()
    del model.encoder.layer[0].intermediate.dense
    with pytest.raises(ValueError, match="has no `dense` Linear"):
        apply_gated_linear_units(model)


def test_bad_config():
    with pytest.raises(ValueError, match="act_fn 'swishy' is not a transformers activation"):
        GatedLinearUnitsConfig(act_fn="swishy")


def test_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r'pip install "trainkit-algorithms\[nlp\]"'):
        apply_gated_linear_units(nn.Linear(2, 2))


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "gated_linear_units") is GatedLinearUnits
