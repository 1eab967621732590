"""Options shared by several `nextn` commands."""
from __future__ import annotations

import click

from nextn.common.errors import NextnError


def kv_cache_options(f):
    """llama.cpp's KV cache type flags, for every command that compiles or loads a model (compile, run, bench,
    serve). Values: f32, f16, bf16, q8_0; glm-dsa's latent and indexer key caches take -ctk. Default: f16 for a GGUF
    (llama.cpp's), an artifact directory's own types for an artifact (another type is refused: the kernels read the
    cache storage, so the types are fixed when a model is compiled; a GGUF is compiled and cached per type)."""
    from nextn.common.kv_types import NAMES

    for long, short, which in (("--cache-type-v", "-ctv", "V"), ("--cache-type-k", "-ctk", "K")):
        f = click.option(short, long, type=click.Choice(NAMES, case_sensitive=False), default=None,
                         help=f"KV cache type for {which} [default: f16 for a GGUF, an artifact's own types]."
                              + (" glm-dsa: also its latent and indexer key caches." if which == "K" else ""))(f)
    return f


def spec_options(f):
    """The speculation flags of `run` and `serve` (llama.cpp's names)."""
    opts = [
        click.option("--spec-type", type=click.Choice(["none", "draft-mtp"]), default=None,
                     help="Speculation: draft-mtp uses the model's NextN head [default: draft-mtp when the model has "
                          "one]."),
        click.option("--spec-draft-n-max", default="3", show_default=True,
                     help="Draft depth n_max: an integer (lowered to the engine's maximum) or 'auto' (adaptive depth "
                          "that falls back to plain decoding when speculation does not pay)."),
        click.option("--spec-draft-n-min", default=0, show_default=True, help="Discard drafts shorter than this."),
        click.option("--spec-draft-p-min", default=0.0, show_default=True,
                     help="Stop drafting when the draft's probability falls below this."),
        click.option("--spec-draft-sampling", type=click.Choice(["greedy", "sample"]), default="greedy",
                     show_default=True,
                     help="At temperature > 0: greedy drafts verified by sample-and-match (same seed = same text as "
                          "spec off), or sampled drafts verified by rejection sampling."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def draft_vocab_options(f):
    """--spec-draft-vocab N / --spec-draft-vocab-file F of run, bench and serve (runtime/draft_vocab.py)."""
    f = click.option("--spec-draft-vocab-file", type=click.Path(dir_okay=False), default=None,
                     help="Token ids ranked most frequent first for --spec-draft-vocab: one id per line, or a JSON "
                          "list [default: the tokenizer's merge order, control tokens first].")(f)
    return click.option("--spec-draft-vocab", type=int, default=None,
                        help="Draft with a head of only the N highest-ranked token rows (FR-Spec; the verify keeps "
                             "the full head, so the output is unchanged). A GGUF is compiled with it (cached per N); "
                             "0: the full head [default: an artifact's own, else the full head].")(f)


def threads_option(f):
    """-t/--threads of run, bench and serve (llama.cpp's flag; runtime/threads.py says how it is counted)."""
    return click.option("-t", "--threads", default=None, type=int,
                        help="CPU threads of the compiled kernels (<= 0: every logical CPU) [default: "
                             "TVM_NUM_THREADS if set, else the physical cores].")(f)


def mtp_index_share_option(f):
    """--mtp-index-share/--no-mtp-index-share of run and serve (glm-dsa, glm5next; llama.cpp's
    index_share_for_mtp_iteration): None leaves the GGUF's attention.indexer.index_share_mtp (on when absent)."""
    return click.option("--mtp-index-share/--no-mtp-index-share", default=None,
                        help="NextN draft steps 1..n-1 reuse step 0's DSA selection (index_share_for_mtp_iteration; "
                             "glm-dsa, glm5next) [default: the GGUF's attention.indexer.index_share_mtp, on when "
                             "absent].")(f)


def parse_n_max(value: str):
    """--spec-draft-n-max: an integer >= 1 or 'auto'."""
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise NextnError(f"--spec-draft-n-max {value}: expected an integer >= 1 or 'auto'")
    return k
