"""CI runs each test once: with TRAINKIT_PACKAGE_TESTS=own-envs (.ci/run), the README's test
command leaves tests/<package>/ to .ci/package-envs and keeps the tests that combine them."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def collect(*paths: str, value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRAINKIT_PACKAGE_TESTS"}
    if value is not None:
        env["TRAINKIT_PACKAGE_TESTS"] = value
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *paths],
        cwd=TESTS.parent, env=env, capture_output=True, text=True, check=False, timeout=240,
    )  # fmt: skip


def test_package_tests_are_left_to_their_own_environments_in_ci():
    paths = ("tests/core/test_time.py", "tests/integration/test_readme.py")
    everything = collect(*paths, value=None)
    assert everything.returncode == 0, everything.stdout + everything.stderr
    assert "tests/core/test_time.py::" in everything.stdout
    assert "tests/integration/test_readme.py::" in everything.stdout
    split = collect("tests", value="own-envs")
    assert split.returncode == 0, split.stdout + split.stderr
    collected = [line for line in split.stdout.splitlines() if "::" in line]
    assert collected and all(
        line.startswith(("tests/integration/", "tests/test_")) for line in collected
    ), collected[:5]


def test_an_unknown_value_is_refused_with_what_is_accepted():
    result = collect("tests/core/test_time.py", value="yes")
    assert result.returncode != 0
    assert "TRAINKIT_PACKAGE_TESTS='yes' is not understood" in result.stdout + result.stderr
