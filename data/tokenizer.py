"""Tokenizers: GPT-2 BPE built offline from data/gpt2.tiktoken, and a character vocabulary (see data/README.md)."""
import base64
import functools
import hashlib
import os

import tiktoken

from machinery.cli import UserError

GPT2_RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2.tiktoken")
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT = 50256  # <|endoftext|>: joins documents in every gpt2 dataset
# the r50k / gpt2 pre-tokenisation regex, as tiktoken 0.14 ships it (tiktoken_ext/openai_public.py)
R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def read_vendored(path, sha256, what):
    """The bytes of a file committed in data/, or a UserError if it is missing or its sha256 differs."""
    restore = f"restore it with `git checkout data/{os.path.basename(path)}`."
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        raise UserError(f"{what} {path} is missing; {restore}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise UserError(f"{what} {path} has sha256 {digest}, not the expected {sha256}; {restore}")
    return raw


@functools.lru_cache(maxsize=4)
def gpt2_encoding(ranks_path=GPT2_RANKS):
    """The GPT-2 tiktoken.Encoding, read from a local rank file after checking its hash. Never touches the network."""
    raw = read_vendored(ranks_path, GPT2_SHA256, "the GPT-2 rank file")
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines() if line)}
    return tiktoken.Encoding(name="gpt2", pat_str=R50K_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=EOT + 1)


class GPT2Tokenizer:
    """GPT-2 BPE. encode() reads '<|endoftext|>' as plain text: EOT ids come only from the prepare scripts."""

    def __init__(self):
        self.enc = gpt2_encoding()
        self.vocab_size = self.enc.n_vocab  # 50257

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts, num_threads=None):
        """Tokenises many documents on every core this process may use (tiktoken's Rust core runs without the GIL):
        a Slurm job's or taskset's, not the machine's, as machinery.device.usable_cores counts them."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return self.enc.encode_ordinary_batch(texts, num_threads=num_threads or cores)

    def decode(self, ids):
        return self.enc.decode([int(i) for i in ids])

    def meta(self):
        return {"tokenizer": "gpt2", "vocab_size": self.vocab_size, "eot": EOT}


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters of the corpus."""

    def __init__(self, itos):
        self.itos = list(itos)
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos) or any(len(c) != 1 for c in self.itos):
            raise UserError("the char vocabulary in meta.json is damaged (it must list distinct single characters); "
                            "prepare the dataset again.")
        self.vocab_size = len(self.itos)

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text)))

    def encode(self, text):
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise UserError(f"the character {e.args[0]!r} is not in this dataset's vocabulary, the "
                            f"{self.vocab_size} characters of its training text") from None

    def decode(self, ids):
        return "".join(self.itos[int(i)] for i in ids)

    def meta(self):
        return {"tokenizer": "char", "vocab_size": self.vocab_size, "itos": self.itos}


def get_tokenizer(meta):
    """The tokenizer described by a dataset's meta.json dict."""
    name = meta.get("tokenizer")
    if name == "gpt2":
        return GPT2Tokenizer()
    if name == "char":
        if "itos" not in meta:
            raise UserError("a char tokenizer needs the vocabulary ('itos') saved in the dataset's meta.json; "
                            "prepare the dataset again.")
        return CharTokenizer(meta["itos"])
    raise UserError(f"unknown tokenizer {name!r} in meta.json; expected 'gpt2' or 'char'.")
