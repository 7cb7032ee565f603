"""``trainkit plugins`` and commands contributed by other packages."""

from trainkit.cli import main


def test_plugins_lists_groups_with_distributions(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "trainkit.loggers (" in out
    assert "progress" in out and "[trainkit-loggers]" in out
    assert "tiny_gpt2" in out and "[trainkit-cli]" in out
    assert "trainkit.commands (" in out


def test_contributed_command_is_dispatched(tmp_path, capsys):
    # `plot` comes from trainkit-loggers through the trainkit.commands entry point.
    code = main(["plot", str(tmp_path)])
    assert code != 0
    assert "metrics.jsonl" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "train" in capsys.readouterr().out
