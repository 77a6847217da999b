"""Each setting is declared once (`radixserve/options.py`): the runtime's source holds no second
default for a declared setting (a keyword default of the same name, a dataclass field, an
argparse flag) and no choice list written twice. A choice list is a module-level constant
collection of strings, a `choices=` argument or a `Literal[...]` of several strings; it is written
twice where the same strings appear as a literal collection anywhere else. Read from the source
with `ast`, so a copy anywhere in the runtime fails here."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from radixserve.config import CONFIGS
from radixserve.options import options_of

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime" / "radixserve"
DECLARATIONS = {RUNTIME / "config.py", RUNTIME / "options.py"}
# the same name with another meaning, by file: what it means there
OTHER_MEANING = {
    ("cli/bench.py", "--tp"): "the all-reduce kernel bench's GPU count",
    ("cli/bench.py", "--seed"): "the online bench's workload seed",
    ("cli/bench.py", "--api-key"): "the key the online bench's client sends",
    ("bench/online.py", "seed"): "a workload's seed",
    ("bench/workload.py", "seed"): "a workload's seed",
    ("testing.py", "seed"): "a test checkpoint's random weights",
    ("utils/tensor.py", "dtype"): "a tensor's dtype",
    ("bench/kv_accuracy.py", "--model"): "the accuracy tool's own run (float32 on CPU by default)",
    ("bench/kv_accuracy.py", "--dtype"): "the accuracy tool's own run (float32 on CPU by default)",
    ("bench/kv_accuracy.py", "--device"): "the accuracy tool's own run (float32 on CPU by default)",
    ("bench/kv_accuracy.py", "--kv-cache-dtype"): "the accuracy tool's list of caches to compare",
}


def _declared() -> tuple[set[str], set[str]]:
    names, flags = set(), set()
    for cls in CONFIGS:
        for f, opt in options_of(cls):
            names.add(f.name)
            flags.update(opt.flags + opt.hidden)
    return names, flags


def _modules(root: Path = RUNTIME) -> list[tuple[Path, ast.AST]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(root.rglob("*.py"))]


def _a_value(node: ast.expr | None) -> bool:
    """A default that states a value: not None ("not given"), not a call (pydantic's `Field`,
    a factory), not the declaration itself (`EngineConfig.seed`)."""
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return False
    if isinstance(node, ast.Call):
        return False
    return not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id.endswith("Config"))


def second_defaults(modules: list[tuple[Path, ast.AST]], names: set[str], flags: set[str],
                    root: Path = RUNTIME) -> list[str]:
    """Each place outside the declarations that gives a declared setting a default of its own."""
    found = []
    for path, tree in modules:
        if path in DECLARATIONS:
            continue
        rel = path.relative_to(root).as_posix()

        def ours(name: str) -> bool:
            return name in names and (rel, name) not in OTHER_MEANING  # noqa: B023

        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                positional = a.posonlyargs + a.args
                pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
                pairs += list(zip(a.kwonlyargs, a.kw_defaults))
                found += [f"{rel}:{node.lineno}: parameter {k.arg}={ast.unparse(d)}"
                          for k, d in pairs if ours(k.arg) and _a_value(d)]
            elif isinstance(node, ast.ClassDef):
                found += [f"{rel}:{s.lineno}: field {s.target.id} = {ast.unparse(s.value)}"
                          for s in node.body if isinstance(s, ast.AnnAssign)
                          and isinstance(s.target, ast.Name) and ours(s.target.id)
                          and _a_value(s.value)]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "add_argument"):
                given = {a.value for a in node.args if isinstance(a, ast.Constant)}
                found += [f"{rel}:{node.lineno}: flag {f} added again" for f in sorted(given & flags)
                          if (rel, f) not in OTHER_MEANING]
    return found


def _string_collection(node: ast.AST) -> frozenset[str] | None:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2 and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return frozenset(e.value for e in node.elts)
    return None


def _literal_strings(node: ast.Subscript) -> frozenset[str] | None:
    name = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
    if name != "Literal":
        return None
    elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if len(elts) >= 2 and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
        return frozenset(e.value for e in elts)
    return None


def _choice_lists(tree: ast.AST) -> list[frozenset[str]]:
    found = [_string_collection(s.value) for s in getattr(tree, "body", [])
             if isinstance(s, (ast.Assign, ast.AnnAssign)) and s.value is not None]
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "choices":
            found.append(_string_collection(node.value))
        elif isinstance(node, ast.Subscript):
            found.append(_literal_strings(node))
    return [f for f in found if f is not None]


def repeated_choice_lists(modules: list[tuple[Path, ast.AST]], root: Path = RUNTIME) -> list[str]:
    """Each choice list whose strings are written as a literal collection more than once."""
    places: dict[frozenset[str], set[tuple[str, int, int]]] = defaultdict(set)
    lists: set[frozenset[str]] = set()
    for path, tree in modules:
        lists.update(_choice_lists(tree))
        for node in ast.walk(tree):
            strings, at = _string_collection(node), node
            if strings is None and isinstance(node, ast.Subscript):
                strings, at = _literal_strings(node), node.slice  # (the slice is walked too)
            if strings is not None:
                places[strings].add((path.relative_to(root).as_posix(), at.lineno, at.col_offset))
    return [f"{sorted(s)} written at {', '.join(f'{p}:{n}' for p, n, _ in sorted(where))}"
            for s, where in places.items() if s in lists and len(where) > 1]


def test_no_declared_setting_has_a_second_default() -> None:
    names, flags = _declared()
    found = second_defaults(_modules(), names, flags)
    assert not found, "declared in config.py, defaulted again:\n" + "\n".join(found)


def test_no_choice_list_is_written_twice() -> None:
    found = repeated_choice_lists(_modules())
    assert not found, "\n".join(found)


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """Negative controls: each kind of copy, planted in a toy tree, is reported."""
    toy = tmp_path / "toy"
    toy.mkdir()
    (toy / "a.py").write_text(
        "MODES = ('fast', 'slow')\n"
        "def run(page_size: int = 1, *, tp=1, cache=None, seed=C.seed):\n    pass\n"
        "class C:\n    cache: str = 'radix'\n"
        "def cli(p):\n    p.add_argument('--dtype', default='auto', choices=('x', 'y'))\n"
        "def f(k):\n    return k in ('k', 'v') or k in ('k', 'v')\n")
    (toy / "b.py").write_text("def g(m):\n    return m in ['slow', 'fast']\n"
                              "Kind = Literal['x', 'y']\nOK = ('fast', 'other')\n")
    modules = _modules(toy)
    found = second_defaults(modules, {"page_size", "tp", "cache"}, {"--dtype"}, toy)
    assert found == ["a.py:2: parameter page_size=1", "a.py:2: parameter tp=1",
                     "a.py:5: field cache = 'radix'", "a.py:7: flag --dtype added again"]
    repeated = repeated_choice_lists(modules, toy)
    assert len(repeated) == 2, repeated  # ('k', 'v') twice in a function is no choice list
    assert "a.py:1" in repeated[0] and "b.py:2" in repeated[0]
    assert "a.py:7" in repeated[1] and "b.py:3" in repeated[1]
