"""`import trainkit.core` is cheap and has no side effects beyond those of `import torch`."""

from import_probe import assert_no_side_effects


def test_import_trainkit_core_has_no_side_effects():
    assert_no_side_effects("trainkit.core")
