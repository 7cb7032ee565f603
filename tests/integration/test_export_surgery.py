"""Surgery methods and export for inference (see packages/algorithms/README.md, "Export /
inference"): the methods that stay in the model export to ONNX and match PyTorch in
onnxruntime; one that must be undone exports through the plain model with its weights."""

import numpy as np
import pytest
import torch

from trainkit.algorithms import (
    apply_alibi,
    apply_blurpool,
    apply_channels_last,
    apply_low_precision_groupnorm,
)
from trainkit.checkpoint import export
from trainkit.trainer import HuggingFaceModel

torchvision = pytest.importorskip("torchvision")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")


def _onnx(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.contiguous().numpy()})[0]


def test_a_blurpool_channels_last_resnet_exports_to_onnx(tmp_path):
    from torchvision.models.resnet import BasicBlock, ResNet

    torch.manual_seed(0)
    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
    replaced = apply_blurpool(model)
    apply_channels_last(model)
    assert replaced  # blurred convs / pools are in the model that is exported
    model.eval()
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = model(x).numpy()
    out = export(model, format="onnx", example_inputs=x, out=tmp_path / "resnet.onnx")
    np.testing.assert_allclose(_onnx(out, x), expected, atol=1e-4, rtol=0)


def test_an_alibi_gpt2_exports_to_onnx_with_dynamic_length(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=40, n_positions=16,
        bos_token_id=39, eos_token_id=39,
    )  # fmt: skip
    gpt2 = transformers.GPT2LMHeadModel(config)
    apply_alibi(gpt2, max_sequence_length=64)
    out = export(HuggingFaceModel(gpt2), format="onnx", out=tmp_path / "alibi.onnx")
    gpt2.eval()
    for length in (6, 40):  # 40: beyond the 16 positions GPT-2 was configured with
        ids = torch.randint(0, 40, (2, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            expected = gpt2(input_ids=ids).logits.numpy()
        np.testing.assert_allclose(_onnx(out, ids), expected, atol=1e-4, rtol=0)


def test_low_precision_groupnorm_is_undone_by_loading_into_the_plain_model(tmp_path):
    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3), torch.nn.GroupNorm(2, 8), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4),
        )  # fmt: skip

    trained = net()
    apply_low_precision_groupnorm(trained)
    assert type(trained[1]).__name__ != "GroupNorm"
    with torch.no_grad():
        trained[1].weight.mul_(1.5)  # "trained": different from a fresh model's
    plain = net()
    plain.load_state_dict(trained.state_dict())  # same parameters, same names
    x = torch.randn(3, 3, 8, 8)
    out = export(plain.eval(), format="onnx", example_inputs=x, out=tmp_path / "gn.onnx")
    with torch.no_grad():
        expected, low = plain(x).numpy(), trained.eval()(x).numpy()
        fresh = net().eval()(x).numpy()
    got = _onnx(out, x)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    # The trained weights are in it: it differs from a fresh model, and from the
    # low-precision model only by its bf16 rounding (the plain norm computes in fp32).
    assert np.abs(got - fresh).max() > 1e-2
    np.testing.assert_allclose(got, low, atol=2e-2, rtol=0)
