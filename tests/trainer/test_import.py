"""`import trainkit.trainer` has no side effects beyond those of `import torch`: it loads
neither transformers (HuggingFaceModel imports it only to load a model) nor any plugin."""

from import_probe import assert_no_side_effects


def test_import_trainkit_trainer_has_no_side_effects():
    assert_no_side_effects("trainkit.trainer")
