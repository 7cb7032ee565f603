"""Export for inference: ONNX run in onnxruntime, ``torch.export`` programs and safetensors
files each give what the PyTorch model gives, from a checkpoint or from a live model."""

import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from toy import blobs, loader, mlp
from trainkit.checkpoint import Checkpointer, export, export_checkpoint
from trainkit.checkpoint._cli import main as checkpoint_cli
from trainkit.trainer import HuggingFaceModel, Trainer

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

VOCAB = 40


def _run_onnx(path, **inputs):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {name: inputs[name].numpy() for name in names})[0], names


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """A classifier trained one epoch with a Checkpointer; the model as trained."""
    folder = tmp_path_factory.mktemp("export") / "ckpt"
    model = mlp(dropout=0.3)
    Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.05),
        max_duration="1ep",
        callbacks=[Checkpointer(folder=str(folder))],
        progress_bar=False,
        device="cpu",
    ).fit()
    return folder, model


def _fresh_net():
    return mlp(seed=123).module  # same architecture, other weights until loaded


def test_mlp_to_onnx_matches_pytorch_in_onnxruntime(mlp_run, tmp_path):
    folder, trained = mlp_run
    net = _fresh_net()
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    dims = {"input": {0: torch.export.Dim.DYNAMIC}}  # nn.Sequential.forward(input)
    out = export(net, folder, format="onnx", example_inputs=(x,), dynamic_shapes=dims,
                 out=tmp_path / "mlp.onnx")  # fmt: skip
    trained.eval()
    with torch.no_grad():
        expected = trained.module(x)
    got, names = _run_onnx(out, input=x)
    assert names == ["input"]
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-4, rtol=0)
    bigger = torch.randn(11, 8)
    with torch.no_grad():
        np.testing.assert_allclose(
            _run_onnx(out, input=bigger)[0], trained.module(bigger).numpy(), atol=1e-4, rtol=0
        )
    assert net.training  # left in the mode it was given in


def test_mlp_to_torch_export_program_loads_and_matches(mlp_run, tmp_path):
    folder, trained = mlp_run
    net = _fresh_net()
    x = torch.randn(4, 8)
    out = export(net, folder, format="torch-export", example_inputs=x, out=tmp_path / "m.pt2")
    program = torch.export.load(out)
    trained.eval()
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), trained.module(x), rtol=0, atol=0)


def test_safetensors_equal_the_state_dict_with_metadata(mlp_run, tmp_path, capsys):
    folder, trained = mlp_run
    out = tmp_path / "w.safetensors"
    code = checkpoint_cli(["export", str(folder), "--format", "safetensors", "--out", str(out)])
    assert code == 0 and "4 tensors (safetensors)" in capsys.readouterr().out
    loaded = load_file(out)
    expected = trained.state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name
    with safe_open(str(out), "pt") as handle:
        meta = handle.metadata()
    assert meta["source"] == str(folder / "ep1-ba4") and '"batch": 4' in meta["timestamp"]
    # From a live module too (Python API), named as the module names them.
    live = export(trained.module, format="safetensors", out=tmp_path / "live.safetensors")
    assert load_file(live).keys() == trained.module.state_dict().keys()


def test_export_needs_example_inputs_and_a_known_format(mlp_run, tmp_path):
    folder, _ = mlp_run
    with pytest.raises(ValueError, match=r"needs example_inputs \(a tensor, a tuple"):
        export(_fresh_net(), folder, format="onnx", out=tmp_path / "m.onnx")
    with pytest.raises(ValueError, match=r"export format 'tflite' is not known; use one of"):
        export(_fresh_net(), format="tflite", out=tmp_path / "m")
    with pytest.raises(ValueError, match=r"the 'hf' format needs a HuggingFace model"):
        export(_fresh_net(), format="hf", out=tmp_path / "m")
    with pytest.raises(Exception, match=r"do not fit Linear: missing from the checkpoint"):
        export(torch.nn.Linear(8, 2), folder, format="safetensors", out=tmp_path / "m")
    assert not any(tmp_path.iterdir())


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
    )  # fmt: skip
    return HuggingFaceModel(transformers.GPT2LMHeadModel(config))


def _bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=32, num_labels=2,
    )  # fmt: skip
    return HuggingFaceModel(transformers.BertForSequenceClassification(config))


def _saved(model, folder):
    ids = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(0))
    labels = ids if model.shift_labels else ids[:, 0] % 2
    batch = {"input_ids": ids, "labels": labels}
    Trainer(
        model=model,
        train_dataloader=[batch, batch],
        optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
        max_duration="1ep",
        callbacks=[Checkpointer(folder=str(folder))],
        progress_bar=False,
        device="cpu",
    ).fit()
    return model.eval()


@pytest.mark.parametrize("make", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_hf_checkpoint_to_onnx_matches_pytorch_in_onnxruntime(make, tmp_path, capsys):
    model = _saved(make(), tmp_path / "ckpt")
    out = tmp_path / "model.onnx"
    argv = ["export", str(tmp_path / "ckpt"), "--format", "onnx", "--out", str(out)]
    assert checkpoint_cli([*argv, "--seq-len", "6", "--batch-size", "2"]) == 0
    assert "(onnx)" in capsys.readouterr().out
    for shape in [(2, 6), (3, 11)]:  # batch and sequence length stay dynamic
        ids = torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(1))
        got, names = _run_onnx(out, input_ids=ids)
        with torch.no_grad():
            expected = model.model(input_ids=ids).logits
        assert names == ["input_ids"]
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-4, rtol=0)


def test_hf_checkpoint_to_torch_export_program(tmp_path):
    model = _saved(_gpt2(), tmp_path / "ckpt")
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "gpt2.pt2", format="torch-export")
    assert "model.transformer.wte.weight" in out
    program = torch.export.load(tmp_path / "gpt2.pt2")
    ids = torch.randint(0, VOCAB, (3, 7))
    with torch.no_grad():
        expected = model.model(input_ids=ids).logits
        torch.testing.assert_close(program.module()(ids), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"seq_len must be an int of at least 2, got 1"):
        export(model, format="onnx", out=tmp_path / "x.onnx", seq_len=1)


def test_a_live_hf_model_exports_tied_weights_to_safetensors(tmp_path):
    model = _gpt2()
    out = export(model, format="safetensors", out=tmp_path / "g.safetensors")
    loaded = load_file(out)  # tied embeddings saved as two copies, as safetensors needs
    for name, tensor in model.model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_a_missing_extra_names_the_install_line(mlp_run, tmp_path, monkeypatch, capsys):
    folder, _ = mlp_run
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'trainkit-checkpoint\[export\]'"):
        export(_fresh_net(), folder, format="onnx", example_inputs=torch.randn(2, 8),
               out=tmp_path / "m.onnx")  # fmt: skip
    assert not any(tmp_path.iterdir())
