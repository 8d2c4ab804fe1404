"""What the repository says of itself holds: README's table of variants is the registry, its table of results is the
shipped summary, and every module says its one job in its first line."""
import ast
import difflib
import json
import re
from pathlib import Path

import activations as A

ROOT = Path(__file__).resolve().parent.parent


def readme_variant_problems(readme, variants):
    """What is wrong with README's table of variants against the registry `variants`, as sentences saying what to do.
    The table holds each variant once, in any order, as long as its mlp rows come before its glu rows."""
    table = readme.split('## The FFN variants')[1].split('\n## ')[0]  # not the guide's example rows
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (mlp|glu) \| .* \| ([^|]+) \|$", table, flags=re.M)
    found = {name: (kind, source.strip()) for name, kind, source in rows}
    last_of = lambda kind: ([n for n, k, _ in rows if k == kind] or [n for n, _, _ in rows] or ['the header'])[-1]
    problems = [f"README.md's table of variants has no row for {name!r}: add `| `{name}` | {v.kind} | φ | extras per "
                f"layer | {v.source} |` among its {v.kind} rows (after the row of {last_of(v.kind)!r}, say)"
                for name, v in variants.items() if name not in found]
    problems += [f"README.md's table of variants has a row for {name!r}, which activations.VARIANTS lacks: remove the "
                 f"row, or add the variant's record to VARIANTS" for name in found if name not in variants]
    problems += [f"README.md's row of {name!r} says {found[name]}, the registry {(v.kind, v.source)}: make them equal"
                 for name, v in variants.items() if name in found and found[name] != (v.kind, v.source)]
    names = [name for name, _, _ in rows]
    grouped = sorted(names, key=lambda n: found[n][0] == 'glu')  # stable: mlp rows first, each kind in its order
    kept = {n for i, _, size in difflib.SequenceMatcher(None, names, grouped, autojunk=False).get_matching_blocks()
            for n in names[i:i + size]}
    for j, name in enumerate(grouped):
        if name not in kept:
            kind, other = found[name][0], {'mlp': 'glu', 'glu': 'mlp'}[found[name][0]]
            place = f"below the row of {grouped[j - 1]!r}" if j else "to the top of the table"
            problems.append(f"README.md's row of {name!r} ({kind}) stands among the {other} rows: move it {place}")
    problems += [f"README.md's table of variants has {names.count(n)} rows for {n!r}: keep one"
                 for n in found if names.count(n) > 1]
    return problems


def test_readme_variant_table_is_the_registry():
    problems = readme_variant_problems((ROOT / 'README.md').read_text(encoding='utf-8'), A.VARIANTS)
    assert not problems, '\n'.join(problems)


def shipped(name):
    return json.loads((ROOT / 'results' / name / 'summary.json').read_text(encoding='utf-8'))


def test_readme_results_table_is_the_shipped_summaries():
    """Each row of README's table of the default comparison says what its shipped summary holds (each variant's rate,
    the loss there, the paired Δ), and the sweep's (the paired Δ at the shared rate)."""
    summary, sweep = shipped('compare_shakespeare_char'), shipped('sweep_shakespeare_char')
    section = (ROOT / 'README.md').read_text(encoding='utf-8').split('## What the default comparison shows')[1]
    lines = [l for l in section.split('\n## ')[0].splitlines() if l.startswith('| ') and not l.startswith('| variant')]
    rows = [[cell.strip() for cell in l.strip().strip('|').split('|')] for l in lines]
    assert [r[0] for r in rows] == list(summary['variants'])
    signed = lambda d: f"{d['mean']:+.3f} ± {d['std']:.3f}".replace('-', '−')
    for v, rate, loss, d_tuned, res_tuned, d_shared, res_shared in rows:
        assert float(rate) == summary['rates'][v], v
        f = summary['variants'][v]['final_val_loss']
        assert loss == f"{f['mean']:.3f} ± {f['std']:.3f}", v
        for text, resolved, d in ((d_tuned, res_tuned, summary['variants'][v]['diff_to_baseline']),
                                  (d_shared, res_shared, sweep['shared'][v]['diff_to_baseline'])):
            if v == summary['baseline']:
                assert (text, resolved) == ('baseline', ''), v
            else:
                assert (text.strip('*'), resolved) == (signed(d), 'yes' if d['resolved'] else 'no'), v


def test_the_default_comparisons_rates_are_the_shipped_sweeps_choice():
    """config/compare_shakespeare_char.py runs each variant at the rate its sweep chose, with the sweep's settings:
    the config and the shipped sweep cannot drift apart."""
    import compare
    from comparison import report
    cfg, sweep = compare.settings([]), shipped('sweep_shakespeare_char')
    assert cfg['tuned_lrs'] == report.tuned_lines(sweep).split("'")[1] and cfg['tuned_at'] == sweep['tuned_at']
    assert compare.check_comparison(cfg)['rates'] == {v: x['best'] for v, x in sweep['lr'].items()}


PAPERS = {'PolyCom': 'ablate_polycom', 'MoA': 'ablate_moa'}  # README's paper column -> its ablation's results/


def claim_verdict(predicts, summary, compared):
    """(the finding as README shows it, resolved?, agrees?) of one claim against a shipped summary. compared: 'a − b'
    (a paired Δ of final losses) or 'best rate a / b'; predicts: '< 0' (a beats b), '≈ 0' (nothing clear), or '≥ 1.5'
    (a's best rate at least 1.5x b's: unresolved where the rates of lowest mean say otherwise than the chosen ones,
    which the one-standard-error rule took from them within a tie)."""
    if compared.startswith('best rate '):
        a, b = compared.removeprefix('best rate ').replace('`', '').split(' / ')
        holds = [summary['lr'][a][k] / summary['lr'][b][k] >= float(predicts.split()[-1]) for k in ('best', 'lowest')]
        ratio = summary['lr'][a]['best'] / summary['lr'][b]['best']
        return f"{ratio:.3g}x", '', 'yes' if all(holds) else 'no' if not any(holds) else 'unresolved'
    a, b = compared.replace('`', '').split(' − ')
    d = summary['pairs'][a][b]
    found = f"{d['mean']:+.3f} ± {d['std']:.3f}".replace('-', '−')
    if predicts == '≈ 0':
        return found, 'yes' if d['resolved'] else 'no', 'no' if d['resolved'] else 'yes'
    return found, 'yes' if d['resolved'] else 'no', ('no' if d['mean'] > 0 else 'yes') if d['resolved'] else 'unresolved'


def test_the_claims_table_is_the_shipped_ablations():
    """Each row of BENCHMARKS' table of the papers' claims says what its ablation's summary.json holds, and whether it
    agrees follows from the claim's prediction: a resolved Δ of the predicted sign agrees, of the other sign disagrees,
    an unresolved one is 'unresolved' (a claim of no clear difference agrees when unresolved)."""
    shipped = {paper for paper, name in PAPERS.items() if (ROOT / 'results' / name / 'summary.json').exists()}
    text = (ROOT / 'BENCHMARKS.md').read_text(encoding='utf-8')
    assert shipped == set() or "## The papers' claims, put through nanoFFN" in text
    section = (text.split("## The papers' claims, put through nanoFFN") + [''])[1]
    lines = [l for l in section.split('\n## ')[0].splitlines() if l.startswith('| ') and not l.startswith('| paper')]
    rows = [[cell.strip() for cell in l.strip().strip('|').split('|')] for l in lines]
    assert {r[0] for r in rows} == shipped  # a row for every shipped ablation, none without one
    for paper, claim, compared, predicts, found, resolved, agrees in rows:
        summary = json.loads((ROOT / 'results' / PAPERS[paper] / 'summary.json').read_text(encoding='utf-8'))
        assert (found.strip('*'), resolved, agrees) == claim_verdict(predicts, summary, compared), claim


def test_every_link_of_the_markdown_files_leads_to_a_file_of_the_repository():
    """README, BENCHMARKS, data/README and the shipped summaries: a relative link or picture names a file that is
    there (a summary copied into results/ brings its pictures along)."""
    pages = [ROOT / 'README.md', ROOT / 'BENCHMARKS.md', ROOT / 'data' / 'README.md', *ROOT.glob('results/**/*.md')]
    assert len(pages) > 8
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in pages
              for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", page.read_text(encoding='utf-8'))
              if '://' not in target and not (page.parent / target).exists()]
    assert broken == []


def test_every_module_opens_with_the_sentence_of_its_job():
    for path in sorted([*ROOT.glob('*.py'), *(ROOT / 'machinery').glob('*.py')]):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and doc.split('\n\n')[0].rstrip().endswith(('.', ':')), f"{path.name} does not open with its job"


def test_a_claims_verdict_follows_its_prediction():
    """On a made-up summary: a resolved Δ of the claimed sign agrees, of the other sign disagrees, an unresolved one
    is 'unresolved'; a claim of no clear difference agrees only when unresolved; a rate claim compares the ratio."""
    d = lambda mean, resolved: {'mean': mean, 'std': 0.01, 'resolved': resolved}
    summary = {'pairs': {'a': {'b': d(-0.02, True), 'c': d(0.02, True), 'e': d(-0.01, False)}},
               'lr': {'a': {'best': 8e-3, 'lowest': 8e-3}, 'b': {'best': 4e-3, 'lowest': 4e-3},
                      'c': {'best': 4e-3, 'lowest': 8e-3}}}
    assert claim_verdict('< 0', summary, '`a` − `b`') == ('−0.020 ± 0.010', 'yes', 'yes')
    assert claim_verdict('< 0', summary, '`a` − `c`') == ('+0.020 ± 0.010', 'yes', 'no')
    assert claim_verdict('< 0', summary, '`a` − `e`')[2] == 'unresolved'
    assert claim_verdict('≈ 0', summary, '`a` − `e`')[2] == 'yes' and claim_verdict('≈ 0', summary, '`a` − `b`')[2] == 'no'
    assert claim_verdict('≥ 1.5', summary, 'best rate `a` / `b`') == ('2x', '', 'yes')
    assert claim_verdict('≥ 1.5', summary, 'best rate `b` / `a`')[2] == 'no'
    assert claim_verdict('≥ 1.5', summary, 'best rate `c` / `b`') == ('1x', '', 'unresolved')  # 2x by the lowest mean


def test_the_gpu_checks_python_imports_only_what_the_project_has():
    """tests/gpu_check.sh runs only where a GPU is lent: a name it imports from the project that has since moved would
    cost that run a part, found only there."""
    import importlib
    text = (ROOT / 'tests' / 'gpu_check.sh').read_text()
    imports = re.findall(r'from ((?:data|machinery)\.\w+|[a-z_]+) import ([\w, ]+)', text)
    own = [(m, names) for m, names in imports if (ROOT / (m.replace('.', '/') + '.py')).exists()]
    assert {m for m, _ in own} >= {'data.write', 'machinery.device', 'machinery.cli'}
    for module, names in own:
        for name in names.split(','):
            assert hasattr(importlib.import_module(module), name.strip()), f"gpu_check.sh: {module} has no {name}"
