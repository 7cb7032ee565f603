"""Muon and warmup-stable-decay named in a config file: built on the model's named
parameters, trained by the Trainer, and bad options refused with the field at fault."""

import pytest

from trainkit.cli._build import build_run
from trainkit.cli._config import ConfigError, load_config
from trainkit.trainer import Trainer
from trainkit.trainer.optim import MuonWithAdamW
from trainkit.trainer.schedulers import WarmupStableDecayScheduler

TINY = """\
model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}
data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}
optimizers: {name: muon, lr: 0.02, adamw_lr: 1.0e-3, adamw_betas: [0.9, 0.95]}
schedulers: [{name: wsd, t_warmup: 1ba, t_decay: 2ba, decay_shape: 1-sqrt, alpha_f: 0.1}]
trainer: {max_duration: 4ba, eval_interval: 4ba, eval_subset_num_batches: 1, device: cpu,
          progress_bar: false}
"""


def _config(tmp_path, text=TINY, overrides=()):
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return load_config(path, ["checkpoint=null", *overrides], run_dir=tmp_path / "run")


def test_muon_and_wsd_by_name_build_and_train(tmp_path):
    run = build_run(_config(tmp_path))
    assert isinstance(run.config.schedulers[0], WarmupStableDecayScheduler)
    trainer = Trainer(run.config)
    (optimizer,) = trainer.state.optimizers
    assert isinstance(optimizer, MuonWithAdamW)
    model = trainer.state.model
    held = {id(p): g["use_muon"] for g in optimizer.param_groups for p in g["params"]}
    roles = {name: held[id(p)] for name, p in model.named_parameters()}
    assert roles == {name: p.ndim == 2 and ".h." in name for name, p in model.named_parameters()}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.fit()
    # The schedule scales both groups: at the end, alpha_f times each one's own rate.
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-4, 0.002])
    moved = [n for n, p in model.named_parameters() if not p.equal(before[n])]
    assert len(moved) == len(before)
    trainer.close()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizers.adjust_lr_fn=wide", r"optimizers.adjust_lr_fn: .*wide is not supported"),
        (
            "optimizers.adamw_modules=['*']",
            r"optimizers.adamw_modules: muon: MuonWithAdamW found no hidden 2-D weight matrix",
        ),
        ("schedulers.0.decay_shape=cosine", r"decay_shape"),
    ],
)
def test_bad_muon_and_wsd_options_name_the_field(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        build_run(_config(tmp_path, overrides=[override]))
