"""Composer's "fine-tune a HuggingFace BERT" Trainer example (with FSDP, microbatching, bf16,
callbacks and checkpoints), ported to trainkit.

Every line that differs from the Composer script carries a ``# Composer:`` comment with
the line it replaces; the rest is Composer's code as it was. Two things are not Composer's
and have nothing to do with the port: the model is built from a small `BertConfig` and the
data is made up (a learnable rule on random token ids), because nothing can be downloaded
here; and ``--help`` options let the tests run it briefly.

    uv run python examples/composer_bert_fsdp.py --save-folder /tmp/bert
    uv run trainkit launch -n 2 examples/composer_bert_fsdp.py --save-folder /tmp/bert
"""

from __future__ import annotations

import argparse

import torch
import transformers
from torch.optim import AdamW
from torch.optim.lr_scheduler import LinearLR
from torch.utils.data import DataLoader, Dataset

from trainkit.algorithms import (
    GradientClipping,  # Composer: from composer.algorithms import GradientClipping
)
from trainkit.core import dist
from trainkit.loggers import (  # Composer: from composer.callbacks import LRMonitor
    FileLogger,
    LRMonitor,
)
from trainkit.parallel import FSDP  # Composer: (FSDP is configured by a dict, below)
from trainkit.profiler import SpeedMonitor  # Composer: from composer.callbacks import SpeedMonitor
from trainkit.trainer import HuggingFaceModel, Trainer
from trainkit.trainer.metrics import Accuracy, CrossEntropy

VOCAB, LENGTH, MARKER = 512, 32, 7


class Sentences(Dataset):
    """Random "sentences"; the label says whether the marker token occurs (learnable)."""

    def __init__(self, n: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(MARKER + 1, VOCAB, (n, LENGTH), generator=generator)
        self.labels = torch.randint(0, 2, (n,), generator=generator)
        where = torch.randint(1, LENGTH, (n,), generator=generator)
        self.input_ids[self.labels == 1, where[self.labels == 1]] = MARKER
        self.input_ids[:, 0] = 1  # [CLS]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids[index],
            "attention_mask": torch.ones(LENGTH, dtype=torch.long),
            "labels": self.labels[index],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-folder", default="checkpoints")
    parser.add_argument("--max-duration", default="2ep")
    parser.add_argument("--save-interval", default="1ep")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--precision", default="amp_bf16")
    parser.add_argument(
        "--print-weights-digest",
        action="store_true",
        help="print each rank's sha256 of the full model weights (replicas must agree)",
    )
    args = parser.parse_args()

    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    # Composer: AutoModelForSequenceClassification.from_pretrained('bert-base-uncased', num_labels=2)
    torch.manual_seed(17)
    model = transformers.BertForSequenceClassification(config)
    metrics = [
        CrossEntropy(),
        Accuracy(),
    ]  # Composer: [CrossEntropy(), MulticlassAccuracy(num_classes=2, average='micro')]
    composer_model = HuggingFaceModel(model, metrics=metrics, eval_metrics=metrics, use_logits=True)

    train_dataset, eval_dataset = Sentences(args.samples, seed=0), Sentences(128, seed=1)
    train_dataloader = DataLoader(
        train_dataset,
        batch_size=16,
        shuffle=False,
        drop_last=False,
        sampler=dist.get_sampler(train_dataset, shuffle=True),
    )
    eval_dataloader = DataLoader(
        eval_dataset, batch_size=32, shuffle=False, sampler=dist.get_sampler(eval_dataset)
    )

    optimizer = AdamW(
        params=composer_model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=3e-6
    )
    linear_lr_decay = LinearLR(optimizer, start_factor=1.0, end_factor=0.25, total_iters=6)

    trainer = Trainer(
        model=composer_model,
        train_dataloader=train_dataloader,
        eval_dataloader=eval_dataloader,
        max_duration=args.max_duration,
        optimizers=optimizer,
        schedulers=[linear_lr_decay],
        algorithms=[GradientClipping(clipping_type="norm", clipping_threshold=1.0)],
        callbacks=[LRMonitor(), SpeedMonitor(window_size=4)],
        loggers=[FileLogger(folder=f"{args.save_folder}/logs")],
        # Composer: parallelism_config={'fsdp': {'sharding_strategy': 'FULL_SHARD', 'mixed_precision': 'DEFAULT'}},
        parallelism=FSDP(sharding="full", mixed_precision="default"),
        device_train_microbatch_size=8,
        precision=args.precision,
        device="gpu" if torch.cuda.is_available() else "cpu",
        save_folder=args.save_folder,
        save_interval=args.save_interval,
        save_num_checkpoints_to_keep=2,
        autoresume=True,
        run_name="bert-fsdp",
        progress_bar=False,
        log_to_console=True,
        console_log_interval="1ep",
        seed=17,
    )
    trainer.fit()
    trainer.close()
    if args.print_weights_digest:
        print(f"rank {dist.get_rank()} weights sha256: {weights_digest(trainer.state.model)}")
    if dist.get_rank() == 0 and "metrics/eval/Accuracy" in trainer.last_eval:
        accuracy = float(trainer.last_eval["metrics/eval/Accuracy"])
        print(f"final eval accuracy: {accuracy:.4f}")


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of the full (unsharded) weights, the same on every rank that holds one model."""
    import hashlib

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    digest = hashlib.sha256()
    for name in sorted(full):
        digest.update(name.encode())
        digest.update(full[name].detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


if __name__ == "__main__":
    main()
