"""README's "Add your own activation", done programmatically: the lines of its three recipes (a fixed activation that is
also a dictionary entry, a gated one and a learned one) are read from README.md and added to a temporary copy of the
registry, the test references and README's table, in several positions, without editing any file. Then: every check
passes and every registry-derived test of the model and the MoE runs them, the learned one keeping only its inputs for
backward and following an edit of its formula as every learned variant does; without any one of the lines a check fails
with the sentence that names it; a record that computes another formula than its reference fails; and the guide's
commands train them and report what they learned in the log, the summary and the pictures."""
import contextlib
import io
import json
import os
import re
import shlex
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_moe  # noqa: E402
from test_docs import readme_variant_problems  # noqa: E402
from test_hostile import TINY  # noqa: E402
import activations as A  # noqa: E402
import compare  # noqa: E402
from comparison import acts  # noqa: E402
import test_activations as T  # noqa: E402
import test_model  # noqa: E402
import train  # noqa: E402
from comparison.runs import to_argv  # noqa: E402
from model import GPTConfig  # noqa: E402

README = (T.ROOT / "README.md").read_text(encoding="utf-8")
GUIDE = README.split("## Add your own activation")[1].split("\n## ")[0]
LISTS = {"BASIS": A.BASIS, "VARIANTS": A.VARIANTS, "REF_BASIS": T.REF_BASIS, "REF_VARIANTS": T.REF_VARIANTS}


def recipes():
    """The guide's lines: {(file, where): code}, `where` one of LISTS, 'above VARIANTS' or 'the table of variants'."""
    pieces = {}
    for block in re.findall(r"```(?:python|markdown)\n(.*?)```", GUIDE, flags=re.S):
        for file, where, code in re.findall(r"^# (\S+), (?:in )?(.+?):\n(.*?)(?=^# |\Z)", block, flags=re.S | re.M):
            pieces[file, where] = pieces.get((file, where), "") + code
    return pieces


PIECES = recipes()
ROWS = re.findall(r"^\| `([a-z0-9_]+)` \| (mlp|glu) \|.*$", PIECES["README.md", "the table of variants"], flags=re.M)
NEW_VARIANTS = [name for name, _ in ROWS]


def guide_entries(name):
    """The guide's entries of the list `name`, evaluated in the namespace of the file they go in, as it stands now."""
    if name in ("BASIS", "VARIANTS"):  # swish_beta_formula and SwishBeta written into activations (`added` removes them)
        exec(PIECES["activations.py", "above VARIANTS"], vars(A))
        return eval("{" + PIECES["activations.py", name] + "}", vars(A))
    return eval("{" + PIECES["tests/test_activations.py", name] + "}", dict(vars(T)))


def table_with(readme, rows, position):
    """README with the table rows `rows` among those of their kind: first, second or last of them."""
    lines = readme.split("\n")
    for row in rows:
        kind = row.split(" | ")[1]
        of_kind = [i for i, l in enumerate(lines) if re.match(rf"\| `\w+` \| {kind} \|", l)]
        lines.insert({"first": of_kind[0], "middle": of_kind[0] + 1, "last": of_kind[-1] + 1}[position], row)
    return "\n".join(lines)


@pytest.fixture(params=["first", "middle", "last"])
def added(request):
    """(README with the guide's rows in its table, {list: the guide's entries}), every list holding the guide's entries
    at one position (the table among its kind) until the test ends. A list that holds a guide's name already (its
    reader followed the guide) is taken as it was before."""
    saved, new, module = {name: dict(d) for name, d in LISTS.items()}, {}, dict(vars(A))
    try:
        for name, d in LISTS.items():  # in this order, so that each record finds the entries it names
            new[name] = guide_entries(name)
            items = [(k, v) for k, v in saved[name].items() if k not in new[name]]
            at = {"first": 0, "middle": len(items) // 2, "last": len(items)}[request.param]
            d.clear()
            d.update(items[:at] + list(new[name].items()) + items[at:])
        rows = re.findall(r"^\|.*\|$", PIECES["README.md", "the table of variants"], flags=re.M)
        before = "\n".join(l for l in README.split("\n") if not any(l.startswith(f"| `{n}` |") for n in NEW_VARIANTS))
        yield table_with(before, rows, request.param), new
    finally:
        for name, d in LISTS.items():
            d.clear()
            d.update(saved[name])
        for name in set(vars(A)) - set(module):
            delattr(A, name)
        vars(A).update(module)  # a reader's own SwishBeta, had they followed the guide already


ONE_POSITION = pytest.mark.parametrize("added", ["middle"], indirect=True)  # for tests that no position concerns


@ONE_POSITION
def test_the_guide_has_three_recipes_and_a_dictionary_entry(added):
    _, new = added
    kinds = {name: v.kind for name, v in new["VARIANTS"].items()}
    learned = [n for n, v in new["VARIANTS"].items() if v.extras(GPTConfig(ffn=n)) > 0]
    assert sorted(kinds.values()) == ["glu", "mlp", "mlp"] and learned == ["swish_beta"] and len(new["BASIS"]) == 1
    assert dict(ROWS) == kinds and set(new["REF_VARIANTS"]) == set(kinds) and set(new["REF_BASIS"]) == set(new["BASIS"])


def test_every_check_passes_with_the_guides_lines(added):
    readme, new = added
    assert readme_variant_problems(readme, A.VARIANTS) == []
    for name in new["BASIS"]:
        T.test_dictionary_entries_and_their_slopes_are_the_textbook_functions(name)
        T.test_la_onehot_equals_fixed_activation_exactly(name)
    for gate in A.MOA_GATES:  # the whole dictionary, the new entry included
        T.test_la_and_moa_match_mixture_reference(gate)
    for variant in NEW_VARIANTS:
        T.test_every_ffn_computes_its_reference_formula(variant)


@ONE_POSITION
def test_the_registry_derived_model_tests_pass_for_the_new_variants(added):
    for variant in NEW_VARIANTS:
        test_model.test_every_variant_is_finite_and_starts_at_log_vocab(variant)
        for d in (64, 128):
            test_model.test_ffn_weights_match_the_4d_mlp_and_extras_are_as_declared(d, variant)
        test_model.test_every_module_built_on_its_own_is_finite_and_initialised_as_documented(variant)
        test_model.test_the_gpt_keeps_every_activation_extra_at_its_start(variant)
        test_moe.test_moe_equals_naive_token_loop(variant, 2)
    report = test_model.GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=84, ffn="swish_beta")).param_report()
    assert report["extras"] == 2  # one β per layer


@ONE_POSITION
def test_the_new_learned_activation_keeps_only_its_inputs_and_runs_its_formula(added, monkeypatch):
    """The checks every learned variant of the registry passes: no more memory for backward than its baseline, and a
    CPU run that follows an edit of its formula."""
    learned = [n for n, v in added[1]["VARIANTS"].items() if v.extras(GPTConfig(ffn=n)) > 0]
    assert learned == ["swish_beta"]
    for variant in learned:
        T.test_learned_variants_keep_no_more_for_backward_than_their_baseline(variant)
        T.check_a_run_follows_an_edit_of_its_formula(variant, False, monkeypatch)


def test_a_new_dictionary_entry_is_mixed_and_passes_gradcheck(added):
    names = ("identity", "relu", "gelu", *added[1]["BASIS"])
    basis = tuple(A.BASIS[n] for n in names)
    h = torch.randn(2, 3, 10, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 3, len(names), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h, c: A.keep_inputs(A.mix_formula, h, c, basis), (h, c))


@pytest.mark.parametrize("variant", NEW_VARIANTS)
def test_without_its_reference_a_variant_fails_saying_what_to_add(added, variant):
    del T.REF_VARIANTS[variant]
    with pytest.raises(AssertionError, match=f"add a float64 reference for '{variant}' to REF_VARIANTS in tests/"):
        T.test_every_ffn_computes_its_reference_formula(variant)


@pytest.mark.parametrize("variant", NEW_VARIANTS)
def test_without_its_row_or_its_record_the_table_check_says_what_to_do(added, variant):
    readme, v = added[0], A.VARIANTS[variant]
    without_row = "\n".join(l for l in readme.split("\n") if not l.startswith(f"| `{variant}` |"))
    (problem,) = readme_variant_problems(without_row, A.VARIANTS)
    assert problem.startswith(f"README.md's table of variants has no row for '{variant}': add `| `{variant}` | "
                              f"{v.kind} | φ | extras per layer | {v.source} |` among its {v.kind} rows (after the "
                              f"row of '")
    del A.VARIANTS[variant]
    assert readme_variant_problems(readme, A.VARIANTS) == [
        f"README.md's table of variants has a row for '{variant}', which activations.VARIANTS lacks: remove the row, "
        f"or add the variant's record to VARIANTS"]


def test_a_row_among_the_other_kind_is_named_with_where_it_goes(added):
    (row,) = [l for l in added[0].split("\n") if l.startswith("| `relu2_glu` |")]
    readme = added[0].replace(row + "\n", "")
    first_row = re.search(r"^\| `(\w+)` \| mlp \|", readme, flags=re.M)
    misplaced = readme.replace(first_row.group(0), row + "\n" + first_row.group(0), 1)  # the top row
    last_mlp = [n for n, kind in re.findall(r"^\| `(\w+)` \| (mlp|glu) \|", readme, flags=re.M) if kind == "mlp"][-1]
    assert readme_variant_problems(misplaced, A.VARIANTS) == [
        f"README.md's row of 'relu2_glu' (glu) stands among the mlp rows: move it below the row of '{last_mlp}'"]


def test_without_its_dictionary_entry_or_its_reference_the_sentence_names_it(added):
    (name,) = added[1]["BASIS"]
    del T.REF_BASIS[name]
    for test in (T.test_dictionary_entries_and_their_slopes_are_the_textbook_functions,
                 T.test_every_ffn_computes_its_reference_formula):  # the fixed variant's reference reads it too
        with pytest.raises(AssertionError, match=f"add an independent reference for '{name}' to REF_BASIS"):
            test(name)
    del A.BASIS[name]
    with pytest.raises(ValueError, match=rf"_fixed\('{name}'\) needs BASIS\['{name}'\] = φ: add it to BASIS"):
        guide_entries("VARIANTS")
    with pytest.raises(ValueError, match="act_dict must be a comma-separated list of identity, "):
        A.parse_dict(f"identity,{name}")


class SwishForgettingBeta(A.Activation):
    """h·σ(h) where h·σ(βh) was meant: β is there, learns nothing, and the FFN runs as if all were well."""

    def __init__(self):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, h, gates=None):
        return h * torch.sigmoid(h)


WRONG = {  # each variant of the guide defined as another formula (identity(g) ⊙ relu(h) is no ReLU²-GLU)
    "softplus": A.Variant("mlp", A._fixed("silu")),
    "relu2_glu": A.Variant("glu", A._fixed("identity"), A._fixed("relu")),
    "swish_beta": A.Variant("mlp", lambda cfg, branch: SwishForgettingBeta(), extras=lambda cfg: 1),
}


@pytest.mark.parametrize("variant", list(WRONG))
def test_a_record_that_computes_another_formula_fails_naming_the_variant(added, variant):
    A.VARIANTS[variant] = WRONG[variant]
    with pytest.raises(AssertionError, match=f"{variant}'s FFN does not compute its formula in REF_VARIANTS"):
        T.test_every_ffn_computes_its_reference_formula(variant)


@ONE_POSITION
def test_the_guides_commands_train_and_report_the_new_activations(added, shakespeare_char_dir, tmp_path, monkeypatch):
    """The guide's compare command (a tiny model, 4 iterations), here in this process (a subprocess would not see the
    test's registry): the new variants and LA with the new entry train; what they learned is in the log, the summary
    and the pictures, compare's acts.png naming the new entry among LA's dictionary weights."""
    (command,) = [l for l in GUIDE.split("\n") if l.startswith("python compare.py ")]
    out, figures, save = str(tmp_path / 'cmp'), {}, acts.save_figure
    monkeypatch.setattr(acts, 'save_figure', lambda fig, path: (figures.update({path: fig}), save(fig, path)))
    argv = [*shlex.split(command)[2:], f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}',
            '--learning_rate=1e-2', '--max_iters=4', '--eval_interval=2', '--seed=1337', *TINY]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cfg = compare.settings(argv)
        for run in compare.grid_runs(cfg, compare.check_comparison(cfg)):  # the runs compare.py plans, trained here
            train.main(to_argv(run.settings))
        compare.main(argv)
    log = [json.loads(l) for l in open(os.path.join(out, 'swish_beta', 'seed1337', 'log.jsonl'))]
    betas = [r['act']['layers'][0]['act']['beta'] for r in log if 'act' in r]
    assert betas[0] == 1.0 and betas[-1] != 1.0  # it starts at 1 and learns
    la = [json.loads(l) for l in open(os.path.join(out, 'la', 'seed1337', 'log.jsonl'))]
    act_dict = [a for a in shlex.split(command) if a.startswith('--act_dict=')][0].split('=')[1]
    assert list(la[-1]['act']['layers'][0]['act']['alpha']) == act_dict.split(',') and 'softplus' in act_dict
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert set(NEW_VARIANTS) <= set(summary['variants'])
    assert summary['variants']['swish_beta']['params']['extras'] == 1
    assert summary['variants']['swish_beta']['learned']['layers'][0]['act']['beta'] == betas[-1]
    md = open(os.path.join(out, 'summary.md')).read()
    assert f"act: beta = {betas[-1]:.3f}" in md and 'softplus' in md
    labels = [t.get_text() for ax in figures[os.path.join(out, 'acts.png')].axes for t in ax.get_yticklabels()]
    assert set(act_dict.split(',')) <= set(labels)  # LA's weight of each entry, by name
    drawn = acts.inspect(os.path.join(out, 'swish_beta', 'seed1337'))
    assert drawn['history']['layers'][0]['act']['beta'] == betas and drawn['layers'][0]['branches']['act']['learnable']
