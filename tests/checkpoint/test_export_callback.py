"""`ExportOnFitEnd`: at the end of ``fit``, the trained model in the chosen formats."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from multirank import run_ranks
from toy import blobs, loader, mlp
from trainkit.checkpoint import ExportOnFitEnd, ExportOnFitEndConfig
from trainkit.core import ParallelStrategy, dist, plugins
from trainkit.trainer import HuggingFaceModel, Trainer

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")


def _fit(model, data, callback, **kwargs):
    trainer = Trainer(
        model=model,
        train_dataloader=data,
        optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
        max_duration="1ep",
        callbacks=[callback],
        progress_bar=False,
        device="cpu",
        **kwargs,
    )
    trainer.fit()
    return trainer


def test_entry_point_and_config():
    assert plugins.load("trainkit.callbacks", "export_on_fit_end") is ExportOnFitEnd
    assert ExportOnFitEnd(folder="x", formats="onnx").config.formats == ["onnx"]
    with pytest.raises(ValueError, match=r"export format 'tflite' is not known; use one of"):
        ExportOnFitEndConfig(folder="x", formats=["safetensors", "tflite"])
    with pytest.raises(ValueError, match=r"filename 'a/b' is not a plain file name"):
        ExportOnFitEnd(folder="x", filename="a/b")


def test_a_classifier_exports_with_the_last_batch_as_example(tmp_path):
    model = mlp(dropout=0.3)
    callback = ExportOnFitEnd(
        folder=str(tmp_path / "{run_name}" / "export"), formats=["safetensors", "torch-export"]
    )
    _fit(model, loader(blobs(64)), callback, run_name="cls")
    folder = tmp_path / "cls" / "export"
    assert callback.written == [folder / "model.safetensors", folder / "model.pt2"]
    weights = load_file(folder / "model.safetensors")
    assert weights.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(weights[name], tensor), name
    program = torch.export.load(folder / "model.pt2")
    batch = [torch.randn(16, 8), torch.zeros(16, dtype=torch.long)]  # as the loader gives
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(program.module()(batch), model(batch))


def test_a_gpt2_exports_onnx_and_a_from_pretrained_folder(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=30, n_positions=16,
        bos_token_id=29, eos_token_id=29, loss_type="ForCausalLM",
    )  # fmt: skip
    model = HuggingFaceModel(transformers.GPT2LMHeadModel(config))
    ids = torch.randint(0, 30, (4, 8), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    callback = ExportOnFitEnd(folder=str(tmp_path), formats=["hf", "onnx"], filename="lm")
    _fit(model, [batch, batch], callback)
    model.eval()
    probe = torch.randint(0, 30, (3, 5))
    with torch.no_grad():
        expected = model.model(input_ids=probe).logits
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lm-hf")
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=probe).logits, expected, rtol=0, atol=0)
    session = ort.InferenceSession(str(tmp_path / "lm.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input_ids": probe.numpy()})[0]
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-4, rtol=0)


class _ShardRoot(ParallelStrategy):
    """FSDP2 on the whole model only (GPT-2's tied embeddings stay in one unit)."""

    @property
    def data_parallel_size(self):
        return dist.get_world_size()

    def prepare(self, state):
        fully_shard(state.model)


def _sharded_gpt2_export(rank, world, folder):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=30, n_positions=16,
        bos_token_id=29, eos_token_id=29, loss_type="ForCausalLM",
    )  # fmt: skip
    model = HuggingFaceModel(transformers.GPT2LMHeadModel(config))
    ids = (torch.arange(32).reshape(4, 8) + rank) % 30
    callback = ExportOnFitEnd(folder=str(folder), formats=["hf", "safetensors"])
    trainer = _fit(model, [{"input_ids": ids, "labels": ids}] * 2, callback,
                   parallelism=_ShardRoot())  # fmt: skip
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(trainer.state.model, options=options)
    return {k: v.clone() for k, v in full.items()}, [str(p) for p in callback.written]


def test_a_sharded_model_is_gathered_and_written_by_rank_0(tmp_path):
    results = run_ranks(_sharded_gpt2_export, 2, tmp_path)
    (full, written), (_, written_1) = results
    assert written == [str(tmp_path / "model-hf"), str(tmp_path / "model.safetensors")]
    assert written_1 == []  # rank 1 took part in the gathering only
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model-hf")
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, full[f"model.{name}"], rtol=0, atol=0)
    weights = load_file(tmp_path / "model.safetensors")
    assert weights.keys() == {k.removeprefix("model.") for k in full}
