"""Splitting a batch into microbatches: tensors along dim 0, per-sample lists of plain
values (ids, texts) along their length, plain values beside them to every microbatch."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainkit.core import TrainModel
from trainkit.core.data import default_num_samples, default_split_batch
from trainkit.trainer import Trainer


def test_per_sample_lists_are_split_and_settings_go_to_every_microbatch():
    batch = {
        "x": torch.arange(10).view(5, 2),
        "text": [f"sample {i}" for i in range(5)],
        "tokens": [["a"], ["b", "c"], [], ["d"], ["e", "f"]],  # one plain list per sample
        "task": "lm",
        "meta": {"id": torch.arange(5), "source": ("s0", "s1", "s2", "s3", "s4")},
    }
    parts = default_split_batch(batch, 2)
    assert [p["text"] for p in parts] == [
        ["sample 0", "sample 1"],
        ["sample 2", "sample 3"],
        ["sample 4"],
    ]
    assert [p["tokens"] for p in parts] == [[["a"], ["b", "c"]], [[], ["d"]], [["e", "f"]]]
    assert [p["meta"]["source"] for p in parts] == [("s0", "s1"), ("s2", "s3"), ("s4",)]
    assert all(p["task"] == "lm" for p in parts)
    assert torch.equal(torch.cat([p["x"] for p in parts]), batch["x"])
    assert torch.equal(torch.cat([p["meta"]["id"] for p in parts]), batch["meta"]["id"])


def test_a_0d_tensor_is_a_setting_for_the_whole_batch():
    batch = {"scale": torch.tensor(0.5), "x": torch.zeros(4, 2)}
    assert default_num_samples(batch) == 4
    parts = default_split_batch(batch, 2)
    assert len(parts) == 2 and all(p["scale"] is batch["scale"] for p in parts)
    per_sample = [torch.tensor(float(i)) for i in range(4)]  # one 0-d tensor per sample
    assert default_split_batch(per_sample, 3) == [per_sample[:3], per_sample[3:]]


def test_a_mapping_of_settings_goes_to_every_microbatch_whole():
    # A generate-mode eval batch: its generation_kwargs are settings for the whole batch.
    kwargs = {"max_new_tokens": 4, "do_sample": False, "stop": {"text": None}}
    batch = {"input_ids": torch.zeros(3, 5), "answers": ["a", "b", "c"], "kwargs": kwargs}
    parts = default_split_batch(batch, 2)
    assert [p["answers"] for p in parts] == [["a", "b"], ["c"]]
    assert all(p["kwargs"] is kwargs for p in parts)


def test_a_plain_value_in_a_tuple_batch_goes_to_every_microbatch():
    inputs, targets = torch.randn(4, 3), torch.arange(4)
    parts = default_split_batch((inputs, targets, 0.5), 3)
    assert [len(p[0]) for p in parts] == [3, 1] and [p[2] for p in parts] == [0.5, 0.5]
    assert torch.equal(torch.cat([p[1] for p in parts]), targets)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({"task": "lm", "step": 3}, "holds no tensor and no per-sample list"),
        ({"x": torch.zeros(4, 2), "f": len}, "cannot split a batch element of type"),
        ({"x": torch.zeros(4, 2), "text": ["a", "b"]}, "different sizes along dim 0"),
    ],
)
def test_batches_that_cannot_be_split_say_so_and_what_to_pass(batch, message):
    with pytest.raises((TypeError, ValueError), match=message) as caught:
        default_split_batch(batch, 2)
    assert "split_batch" in str(caught.value) or "evenly" in str(caught.value)


class Texts(Dataset):
    """Samples as HF-style dicts with a text field the default collate keeps as strings."""

    def __len__(self):
        return 32

    def __getitem__(self, index):
        return {"x": torch.full((4,), float(index)), "y": index % 2, "text": f"sample {index}"}


class SeesTexts(TrainModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 2)
        self.seen: list[list[str]] = []

    def forward(self, batch):
        self.seen.append(list(batch["text"]))
        return self.net(batch["x"])

    def loss(self, outputs, batch):
        return nn.functional.cross_entropy(outputs, batch["y"])


def test_microbatches_of_batches_with_text_fields_train_like_the_whole_batch():
    runs = {}
    for size in (None, 4):
        model = SeesTexts()
        Trainer(
            model=model, train_dataloader=DataLoader(Texts(), batch_size=16), max_duration="2ba",
            device_train_microbatch_size=size, progress_bar=False, device="cpu", seed=1,
        ).fit()  # fmt: skip
        runs[size] = model
    whole, split = runs[None], runs[4]
    assert split.seen[:4] == [[f"sample {i}" for i in range(j, j + 4)] for j in (0, 4, 8, 12)]
    assert [t for seen in split.seen for t in seen] == [t for seen in whole.seen for t in seen]
    for a, b in zip(whole.parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(a, b)
