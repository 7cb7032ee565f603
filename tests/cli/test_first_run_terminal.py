"""What the first run prints (issue 52.9): no third-party notices at import, no token count
for data without tokens, the CLI README promising only the plots the default run draws."""

import logging
from pathlib import Path

from trainkit.cli._default import quiet_third_party_imports
from trainkit.cli._train import _trained
from trainkit.core import Timestamp

NOTICE = (
    "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value "
    "type. Calling register_constant() on Enum subclasses is deprecated and will be an error "
    "in a future release."
)


def test_only_torchs_notice_about_torchaos_enums_is_dropped_and_only_while_importing():
    logger = logging.getLogger("torch.utils._pytree")
    heard: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: heard.append(record.getMessage())
    logger.addHandler(handler)
    try:
        with quiet_third_party_imports():
            logger.warning(NOTICE, "<enum 'KernelPreference'>")
            logger.warning("another pytree warning")
        logger.warning(NOTICE, "<enum 'Later'>")
    finally:
        logger.removeHandler(handler)
    assert heard == ["another pytree warning", NOTICE % "<enum 'Later'>"]


def test_the_summary_counts_tokens_only_when_the_data_has_them():
    assert _trained(Timestamp(batch=168, total_wct=0.23)) == "trained 168 batches in 0.2 s"
    text = Timestamp(batch=1436, token=23_500_000, total_wct=230.4)
    assert _trained(text) == "trained 1436 batches (23.5M tokens) in 230 s"
    few = Timestamp(batch=10, token=40_960, total_wct=8.24)  # was "(0.0M tokens)"
    assert _trained(few) == "trained 10 batches (40,960 tokens) in 8.2 s"


def test_the_cli_readme_promises_only_the_plots_the_default_run_draws():
    readme = (Path(__file__).parents[2] / "packages/cli/README.md").read_text()
    layout = [line for line in readme.splitlines() if line.startswith("runs/<name>/")]
    plots = [line for line in layout if ".png" in line]
    assert len(plots) == 1 and plots[0].startswith("runs/<name>/loss.png")
    assert "learning-rate" not in plots[0] and "throughput" not in plots[0]
