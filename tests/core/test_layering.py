"""trainkit-core stays the small contract it promises: no import cycle among its modules (at
module level or inside a function; type-only imports may point back), at most 4,843 lines
of source and 35 top-level names, used by the other packages through its public names
only. (import-linter checks that it imports no sibling.)"""

import ast
from pathlib import Path

import trainkit.core
from import_graph import cycles, exported_twice, import_graph, package_modules

PACKAGES = Path(__file__).resolve().parents[2] / "packages"


def test_core_has_no_import_cycle():
    assert cycles(import_graph("trainkit.core")) == []


def test_core_stays_small():
    lines = sum(
        len(path.read_text().splitlines()) for path in package_modules("trainkit.core").values()
    )
    # 4,500 at the split (issue 51). Since then the contract grew by what plugin authors and
    # users meet in it: the rule that builds a model on the meta device (trainkit.core.meta,
    # issue 53), and config fields filled by position, did-you-mean, other libraries' names
    # answered, warnings at the user's line and the resume a run reports (issue 52). A new
    # feature of the Trainer still goes to trainkit-trainer.
    # +14 (issue 55): `dist.rendezvous_interval`, when `init_distributed` started the group,
    # which the Trainer reports as a part of its restart time wherever the group was started.
    # +7 (issue 55): `ParallelStrategy.step_committed`: a fault-tolerant strategy's skipped
    # step must not be counted by the loop, and only the contract can say so to it.
    # +2 (issue 56): the `trainkit.recipes` entry-point group, named with the others.
    # +73 (issue 54): SLURM's srun environment read by init_distributed, the one place
    # trainkit reads the launcher's environment.
    # +16 (issue 54): `ParallelStrategy.runs_forward_backward` / `forward_backward`, so a
    # pipeline schedule (forward and backward together) runs the step's microbatches.
    assert lines <= 4843, (
        f"trainkit-core has {lines} lines of source; the contract keeps it <= 4,843"
    )
    assert len(trainkit.core.__all__) <= 35, sorted(trainkit.core.__all__)


def test_each_public_name_has_one_home():
    assert exported_twice("trainkit.core") == {}


def test_the_scan_finds_a_cycle_hidden_in_a_function_and_ignores_type_only_imports(tmp_path):
    (tmp_path / "__init__.py").write_text("from trainkit.fake._a import A\n")
    (tmp_path / "_a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from trainkit.fake._c import C\n"
        "class A:\n    def b(self):\n        from trainkit.fake._b import B\n        return B\n"
    )
    (tmp_path / "_b.py").write_text("from trainkit.fake import _a\nB = 1\n")
    (tmp_path / "_c.py").write_text("from trainkit.fake._a import A\nC = A\n")
    graph = import_graph("trainkit.fake", tmp_path)
    assert graph["trainkit.fake._a"] == {"trainkit.fake._b"}
    assert cycles(graph) == [["trainkit.fake._a", "trainkit.fake._b"]]


def test_other_packages_use_the_contract_by_its_public_names():
    # trainkit.core and its public submodules (trainkit.core.data, ...) are the contract; its
    # private modules may change with any release, so no package outside core imports one.
    private = []
    for path in sorted(PACKAGES.glob("*/src/trainkit/**/*.py")):
        if path.is_relative_to(PACKAGES / "core"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            private += [
                f"{path.relative_to(PACKAGES)}:{node.lineno} {name}"
                for name in names
                if name.startswith("trainkit.core._")
            ]
    assert len(list(PACKAGES.glob("*/src/trainkit/*/__init__.py"))) >= 8  # the scan sees them
    assert private == []
