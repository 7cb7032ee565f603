"""``trainkit plugins`` and commands contributed by other packages."""

from trainkit.cli import main
from trainkit.core import plugins


def test_plugins_lists_groups_with_distributions(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "trainkit.loggers (" in out
    assert "tiny_gpt2" in out and "[trainkit-cli]" in out
    assert "trainkit.commands (" in out
    schedulers = len(plugins.available("trainkit.schedulers"))
    assert f"trainkit.schedulers ({schedulers})" in out and "trainkit.trainer.schedulers:" in out
    assert "trainkit.optimizers (" in out and "torch.optim:AdamW" in out
    assert "[trainkit-trainer]" in out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "train" in capsys.readouterr().out
