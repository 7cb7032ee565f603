"""trainkit-trainer has no import cycle among its modules, at module level or inside a
function (type-only imports may point back). (import-linter checks that it imports no
sibling package and core none of it.)"""

from import_graph import cycles, exported_twice, import_graph


def test_the_trainer_has_no_import_cycle():
    assert cycles(import_graph("trainkit.trainer")) == []


def test_each_public_name_has_one_home():
    assert exported_twice("trainkit.trainer") == {}
