"""The house's layering, read from the code's own imports: every module stands in one layer and imports only from its
own layer or the ones below, with no circle; machinery/ imports nothing of the project above it, and no command imports
another."""
import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# from the ground up; a name ending in '.' stands for every module below it
LAYERS = [
    {'machinery.'},  # what every command stands on: the command line, files, hardware, a run's log and checkpoint
    {'activations', 'model'},  # the ideas
    {'configurator', 'data.'},  # a run's settings, and its data
    {'comparison.'},  # a comparison's parts: its runs, where they train, their report, statistics and pictures
    {'train', 'sample', 'compare', 'bench', 'inspect_run'},  # the commands
]
COMMANDS = LAYERS[-1]


def modules():
    paths = [*ROOT.glob('*.py'), *(ROOT / 'data').rglob('*.py'),
             *(p for folder in ('machinery', 'comparison') for p in (ROOT / folder).glob('*.py'))]
    return {'.'.join(p.relative_to(ROOT).with_suffix('').parts).removesuffix('.__init__'): p for p in paths}


def imports(path, known):
    """The modules of this repository that a file imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f'{node.module}.{a.name}' for a in node.names}
    return out & set(known)


def layer(name):
    return next(i for i, members in enumerate(LAYERS)
                if name in members or any(m.endswith('.') and (name + '.').startswith(m) for m in members))


def test_every_module_imports_only_its_own_layer_and_those_below():
    mods = modules()
    problems = []
    for name, path in sorted(mods.items()):
        try:
            mine = layer(name)
        except StopIteration:
            problems.append(f"{name} stands in no layer: add it to LAYERS where its imports put it")
            continue
        problems += [f"{name} (layer {mine}) imports {other} (layer {layer(other)}), a layer above it"
                     for other in imports(path, mods) if layer(other) > mine]
    assert not problems, '\n'.join(problems)


def test_no_circle_and_no_command_imports_another():
    mods = modules()
    graph = {name: imports(path, mods) - {name, 'machinery', 'comparison', 'data'} for name, path in mods.items()}

    @functools.lru_cache(maxsize=None)
    def floor(name, below=()):
        assert name not in below, f"a circle of imports: {' -> '.join(below + (name,))}"
        return 1 + max((floor(other, below + (name,)) for other in graph[name]), default=0)

    assert max(map(floor, graph)) <= 7  # the longest chain: cli, files, data.shards, data.loader, runs, ladder, compare
    for command in COMMANDS:
        assert not graph[command] & COMMANDS, f"{command} imports {graph[command] & COMMANDS}"
