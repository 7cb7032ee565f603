"""``trainkit plugins`` and ``trainkit <command>`` with trainkit-loggers installed."""

from trainkit.cli import main


def test_plugins_lists_another_distributions_entry_points(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "progress" in out and "[trainkit-loggers]" in out


def test_contributed_command_is_dispatched(tmp_path, capsys):
    # `plot` comes from trainkit-loggers through the trainkit.commands entry point.
    code = main(["plot", str(tmp_path)])
    assert code != 0
    assert "metrics.jsonl" in capsys.readouterr().err
