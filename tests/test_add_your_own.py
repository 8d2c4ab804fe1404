"""README's "Add your own activation", done programmatically: a learnable activation (Swish-β) and a dictionary entry
(softplus) added to the registry at test time, without editing any file, then the whole path: the registry-derived
tests of the model and the MoE pass for them, they train, their `learned()` record reaches the log, the summary and the
pictures, and the registry-driven checks of the docs and of the test references say exactly what to add."""
import contextlib
import io
import json
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import activations as A  # noqa: E402
import compare  # noqa: E402
import inspect_run  # noqa: E402
import test_activations  # noqa: E402
import test_model  # noqa: E402
import test_moe  # noqa: E402
import train  # noqa: E402
from cli import to_argv  # noqa: E402
from model import GPTConfig  # noqa: E402
from test_docs import readme_variant_problems  # noqa: E402
from test_hostile import TINY  # noqa: E402


class SwishBeta(A.Activation):
    """φ(h) = h·σ(βh), β learned per FFN, init 1 (Ramachandran et al. 2017, "Searching for Activation Functions")."""

    def __init__(self):
        super().__init__()
        self.beta = nn.Parameter(torch.tensor(1.0))

    def forward(self, h, coefs=None):
        return h * torch.sigmoid(self.beta * h)

    def learned(self, x):
        return {"beta": self.beta.item()}


SOURCE = 'Ramachandran et al. 2017, "Searching for Activation Functions"'


@pytest.fixture
def added(monkeypatch):
    """The registry with Swish-β and softplus, as the guide adds them to activations.py."""
    monkeypatch.setitem(A.VARIANTS, "swish_beta", A.Variant("mlp", lambda cfg, branch: SwishBeta(),
                                                            extras=lambda cfg: 1, source=SOURCE))
    monkeypatch.setitem(A.BASIS, "softplus", (F.softplus, torch.sigmoid))
    monkeypatch.setitem(test_activations.REF_BASIS, "softplus", lambda h: torch.log1p(torch.exp(h)))


def test_the_registry_derived_model_tests_pass_for_a_new_variant(added):
    test_model.test_every_variant_is_finite_and_starts_at_log_vocab("swish_beta")
    for d in (64, 128):
        test_model.test_ffn_weights_match_the_4d_mlp_and_extras_are_as_declared(d, "swish_beta")
    test_model.test_every_module_built_on_its_own_is_finite_and_initialised_as_documented("swish_beta")
    test_model.test_the_gpt_keeps_every_activation_extra_at_its_start("swish_beta")
    test_moe.test_moe_equals_naive_token_loop("swish_beta", 2)
    report = test_model.GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=84, ffn="swish_beta")).param_report()
    assert report["extras"] == 2  # one β per layer


def test_a_new_dictionary_entry_is_mixed_exactly_and_its_derivative_checked(added):
    test_activations.test_dictionary_entries_and_their_derivatives_are_the_textbook_functions("softplus")
    test_activations.test_la_onehot_equals_fixed_activation_exactly("softplus")
    names = ("identity", "relu", "gelu", "softplus")
    basis = tuple(A.BASIS[n] for n in names)
    h = torch.randn(2, 3, 10, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 3, len(names), dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(A.lean.mix(h, c, basis), A.mix_formula(h, c, basis))
    assert torch.autograd.gradcheck(lambda h, c: A.lean.mix(h, c, basis), (h, c))


def test_a_missing_reference_or_readme_row_says_what_to_add(added, monkeypatch):
    monkeypatch.delitem(test_activations.REF_BASIS, "softplus")
    with pytest.raises(AssertionError, match="add an independent reference for 'softplus' to REF_BASIS"):
        test_activations.test_dictionary_entries_and_their_derivatives_are_the_textbook_functions("softplus")
    with open(os.path.join(test_activations.ROOT, "README.md"), encoding="utf-8") as f:  # as before the guide's row
        readme = "".join(line for line in f if not line.startswith("| `swish_beta` |"))
    problems = readme_variant_problems(readme, A.VARIANTS)
    assert problems == [f"README.md's table of variants has no row for 'swish_beta': add `| `swish_beta` | mlp | φ | "
                        f"extras per layer | {SOURCE} |` after the row of 'xielu_glu'"]


def test_the_guides_commands_train_and_report_the_new_activation(added, shakespeare_char_dir, tmp_path):
    """The guide's two commands, here in this process (a subprocess would not see the test's registry): Swish-β and LA
    with the new entry train; what they learned is in the log, the summary and the pictures."""
    out = str(tmp_path / 'cmp')
    argv = [f'--data_dir={shakespeare_char_dir}', f'--out_dir={out}', '--variants=gelu,swish_beta,la', '--seeds=1',
            '--act_dict=identity,relu,gelu,softplus', '--lrs=', '--learning_rate=1e-2', '--max_iters=4',
            '--eval_interval=2', *TINY]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for run in compare.plan(compare.settings(argv))[3]:  # the runs compare.py plans, trained here
            train.main(to_argv(run['settings']))
        compare.main(argv)
    log = [json.loads(l) for l in open(os.path.join(out, 'swish_beta', 'seed1337', 'log.jsonl'))]
    betas = [r['act']['layers'][0]['act']['beta'] for r in log if 'act' in r]
    assert betas[0] == 1.0 and betas[-1] != 1.0  # it starts at 1 and learns
    la = [json.loads(l) for l in open(os.path.join(out, 'la', 'seed1337', 'log.jsonl'))]
    assert set(la[-1]['act']['layers'][0]['act']['alpha']) == {'identity', 'relu', 'gelu', 'softplus'}
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert summary['variants']['swish_beta']['params']['extras'] == 1
    assert summary['variants']['swish_beta']['learned']['layers'][0]['act']['beta'] == betas[-1]
    md = open(os.path.join(out, 'summary.md')).read()
    assert f"act: beta = {betas[-1]:.3f}" in md and 'softplus' in md
    acts = inspect_run.inspect(os.path.join(out, 'swish_beta', 'seed1337'))
    assert acts['history']['layers'][0]['act']['beta'] == betas and acts['layers'][0]['branches']['act']['learnable']
