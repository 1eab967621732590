"""The `nextn` command line. User errors print one line on stderr and exit 1, never a traceback.

Every command and its options are declared here and in cli_tune.py, so `nextn --help` and `nextn run ARTIFACT`
import no compiler module; the commands that compile or tune (compile, tune, tuning export/import/merge/ingest/
show) call the compiler through `nextn.compiler.entry`, imported when such a command runs.
"""
from __future__ import annotations

import json
import os
import sys

import click

from nextn.common.compile_options import CompileOptions
from nextn.common.errors import NextnError

from .cli_options import (draft_vocab_options, kv_cache_options, mtp_index_share_option, parse_n_max, spec_options,
                          threads_option)
from .text_stream import TextStream


MTP_DENSE_HELP = ("glm-dsa (GLM-5.x): run the NextN block as dense MLA without an indexer, as llama.cpp does. "
                  "Default: the NextN block's own DSA indexer, computed at draft step 0 and reused by the later "
                  "draft steps of a round (index_share_for_mtp_iteration). A compile option, recorded in the manifest.")


@click.group()
@click.version_option(package_name="nextn")
def cli():
    """nextn: compile GLM GGUFs ahead of time and decode with NextN/MTP self-speculation."""


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--target", default="llvm", show_default=True, help="Compile target: llvm (this CPU), cuda, rocm.")
@click.option("--arch", "arches", multiple=True,
              help="GPU arch(s), repeatable or a comma list: sm_80,sm_86,sm_89,sm_90,sm_120 (cuda, one fatbin) or "
                   "gfx90a,gfx942,gfx1100 (rocm, a library each) [default: sm_80,sm_90,sm_120 / gfx942].")
@click.option("-o", "--output", "out", default=None, help="Artifact directory [default: artifacts/<model>-<target>].")
@click.option("-md", "--model-draft", "draft", default=None, help="MTP-only GGUF (draft) next to a trunk-only MODEL.")
@click.option("--dump-ir", default=None, help="Write the IR graphs and each Relax phase to this directory.")
@click.option("--mtp-dense-attention", is_flag=True, help=MTP_DENSE_HELP)
@click.option("--tuning-log", default=None, help="Tuning log (LOG_DIR or FILE.json) from `nextn tune`: tuned kernels "
                                                 "use its schedules, the others the default ones.")
@click.option("--cuda-graph/--no-cuda-graph", default=True, show_default=True,
              help="CUDA: replay the decode, verify and draft steps as CUDA graphs (one per row count and "
                   "256-cell KV bucket).")
@click.option("--exact-matmul", is_flag=True,
              help="CPU: float activations in every matmul. By default K-quant, IQ4_XS, Q8_0, IQ4_NL and MXFP4 "
                   "matmuls quantize each activation row to 8 bits (as llama.cpp's CPU backend does), which is "
                   "faster.")
@click.option("--verify-model", is_flag=True,
              help="Read every byte of the model GGUF(s) for their sha256 (progress bar; printed and recorded in the "
                   "manifest). Without it the model is identified by its header, which is read in a fraction of a "
                   "second.")
@kv_cache_options
@click.option("--spec-draft-vocab", default=0, show_default=True,
              help="Also compile draft steps whose head has only N token rows (run/serve/bench --spec-draft-vocab; the "
                   "rows are chosen when the artifact is loaded). 0: none.")
def compile(model, target, arches, out, draft, dump_ir, mtp_dense_attention, tuning_log, cuda_graph, exact_matmul,
            verify_model, cache_type_k, cache_type_v, spec_draft_vocab):
    """Compile MODEL.gguf into an artifact directory (library + manifest.json)."""
    from nextn.compiler import entry

    if out is None:
        base = os.path.splitext(os.path.basename(model))[0]
        out = os.path.join("artifacts", f"{base}-{target}")
    options = entry.CompileOptions(target=target, arches=arches, mtp_dense_attention=mtp_dense_attention,
                                   cache_type_k=cache_type_k, cache_type_v=cache_type_v, draft_vocab=spec_draft_vocab,
                                   exact_matmul=exact_matmul, cuda_graph=cuda_graph, tuning_log=tuning_log)
    entry.compile_model(model, out, options, draft=draft, dump_ir=dump_ir, verify_model=verify_model,
                        log=lambda m: click.echo(m, err=True))


@cli.command()
@click.argument("model", type=click.Path())
@click.option("-p", "--prompt", default=None, help="Prompt text (tokenized without any prefix).")
@click.option("-f", "--prompt-file", type=click.Path(dir_okay=False), default=None, help="Read the prompt from a file.")
@click.option("-n", "--n-predict", default=64, show_default=True, help="Tokens to generate.")
@click.option("--temp", default=0.0, show_default=True, help="Temperature; 0 = greedy.")
@click.option("--seed", default=None, type=int, help="RNG seed for sampling.")
@click.option("-c", "--ctx-size", default=None, type=int, help="Context size (KV cells) [default: min(train ctx, 4096)].")
@spec_options
@draft_vocab_options
@click.option("--top-k", default=40, show_default=True, help="Top-k sampling (<= 0: off).")
@click.option("--top-p", default=0.95, show_default=True, help="Top-p sampling (1.0: off).")
@click.option("--min-p", default=0.05, show_default=True, help="Min-p sampling (0.0: off).")
@click.option("--stop", "stops", multiple=True, help="Stop string (repeatable); the text ends before it.")
@click.option("-md", "--model-draft", "draft", default=None, help="MTP-only GGUF (draft) for a trunk-only model.")
@click.option("--target", default="llvm", show_default=True, help="Target used when MODEL is a GGUF.")
@click.option("--arch", "arches", multiple=True, help="GPU arch(s) when MODEL is a GGUF compiled for cuda/rocm.")
@click.option("--device", default="cpu", show_default=True, help="Where to run: cpu, or cuda:N for a CUDA artifact.")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at end-of-generation tokens.")
@click.option("--mtp-dense-attention", is_flag=True, help=MTP_DENSE_HELP + " Applies when MODEL is a GGUF.")
@kv_cache_options
@threads_option
@mtp_index_share_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def run(model, prompt, prompt_file, n_predict, temp, seed, ctx_size, spec_type, spec_draft_n_max, spec_draft_n_min,
        spec_draft_p_min, spec_draft_sampling, spec_draft_vocab, spec_draft_vocab_file, top_k, top_p, min_p, stops,
        draft, target, arches, device,
        ignore_eos, mtp_dense_attention, cache_type_k, cache_type_v, threads, mtp_index_share, as_json):
    """Generate from MODEL (a GGUF, compiled and cached on first use, or an artifact directory)."""
    from .api import load
    from .params import SamplingParams, SpecParams, resolve_spec_type

    if prompt is not None and prompt_file is not None:
        raise NextnError("give either -p or --prompt-file, not both")
    if prompt_file is not None:
        try:
            with open(prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as e:
            raise NextnError(f"{prompt_file}: cannot read the prompt file ({e.strerror})") from None
    if prompt is None:
        raise NextnError("no prompt: give -p TEXT or --prompt-file F")
    if n_predict < 1:
        raise NextnError(f"-n {n_predict}: expected >= 1")
    n_max = parse_n_max(spec_draft_n_max)
    sampling = SamplingParams(n_predict, temp, top_k, top_p, min_p, seed, stops, ignore_eos).check()
    want_spec = spec_type != "none"
    options = CompileOptions(target=target, arches=arches, mtp_dense_attention=mtp_dense_attention,
                             cache_type_k=cache_type_k, cache_type_v=cache_type_v, draft_vocab=spec_draft_vocab)
    m = load(model, ctx_size=ctx_size, spec=want_spec, draft=draft, device=device,
             log=lambda s: click.echo(s, err=True), threads=threads,
             max_draft=n_max if isinstance(n_max, int) else None, mtp_index_share=mtp_index_share,
             draft_vocab_file=spec_draft_vocab_file, options=options)
    spec = SpecParams(resolve_spec_type(spec_type, m.has_mtp, model, "--model-draft"), n_max, spec_draft_n_min,
                      spec_draft_p_min, spec_draft_sampling)
    shown = None if as_json else TextStream(m.tokenizer.token_to_bytes, stops)   # printed as tokens are emitted

    def show(toks):
        text = "".join(shown.push(t) or "" for t in toks)
        if text:
            click.echo(text, nl=False)
            sys.stdout.flush()

    r = m.generate(prompt, sampling=sampling, spec=spec, on_tokens=None if as_json else show)
    if as_json:
        click.echo(json.dumps({**r.to_json(), "kv_cache": m.sequence.kv_cache}))
        return
    click.echo(shown.finish())
    s = r.stats
    if spec.enabled:
        pos = ", ".join(f"{x:.3f}" for x in s.per_pos)
        if r.n_max_requested != r.n_max:
            click.echo(f"--spec-draft-n-max {r.n_max_requested} lowered to the engine's maximum {r.n_max}", err=True)
        for ev in s.events:
            click.echo(f"auto depth: at token {ev['at_token']} -> depth {ev['to_depth']}: {ev['why']}", err=True)
        click.echo(f"draft-mtp n_max={r.n_max}: draft acceptance = {s.acceptance:.3f} "
                   f"({s.accepted} accepted / {s.drafted} drafted), rounds = {s.rounds}, mean len = {s.mean_len:.3f}, "
                   f"acc per pos = ({pos})", err=True)
    click.echo(f"prompt {r.prompt_tokens} tokens in {r.prefill_s * 1e3:.1f} ms; generated {len(r.ids)} tokens in "
               f"{r.decode_s * 1e3:.1f} ms ({r.tokens_per_s:.1f} tok/s), finish: {r.finish_reason}", err=True)


@cli.command()
@click.argument("model", type=click.Path())
@click.option("--prompts", default=None, type=click.Path(dir_okay=False),
              help="Prompt set (JSON list of {kind, text}) [default: the house set shipped with nextn].")
@click.option("-o", "--output", "out", default="bench-report.json", show_default=True,
              help="JSON report; the PNG goes next to it (same name, .png).")
@click.option("-n", "--n-predict", default=64, show_default=True, help="Tokens per generation.")
@click.option("--repeat", default=3, show_default=True, help="Runs per cell; the fastest counts.")
@click.option("--temp", default=0.8, show_default=True, help="Temperature of the sampled runs.")
@click.option("--seed", default=1, show_default=True, help="Seed of the sampled runs.")
@click.option("-c", "--ctx-size", default=4096, show_default=True, help="Context size (KV cells).")
@click.option("--target", default="llvm", show_default=True, help="Target used when MODEL is a GGUF.")
@click.option("--device", default="cpu", show_default=True, help="Where to run: cpu, or cuda:N for a CUDA artifact.")
@click.option("--no-plot", is_flag=True, help="Do not draw the PNG.")
@kv_cache_options
@threads_option
@draft_vocab_options
def bench(model, prompts, out, n_predict, repeat, temp, seed, ctx_size, target, device, no_plot, cache_type_k,
          cache_type_v, threads, spec_draft_vocab, spec_draft_vocab_file):
    """House benchmark: greedy and sampled, spec off / n_max 1..3 / auto, per prompt kind (report, table, PNG)."""
    from .bench import run_bench

    options = CompileOptions(target=target, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                             draft_vocab=spec_draft_vocab)
    run_bench(model, prompts, out, n_predict=n_predict, repeat=repeat, temp=temp, seed=seed, ctx_size=ctx_size,
              device=device, plot=not no_plot, log=lambda s: click.echo(s, err=True), threads=threads,
              draft_vocab_file=spec_draft_vocab_file, options=options)


@cli.command("draft-vocab")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--from", "texts", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Text file (UTF-8) whose tokens are counted; repeatable. Your own prompts and outputs.")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Rank file to write (one token id per line, most frequent first): --spec-draft-vocab-file.")
@click.option("--fill/--no-fill", default=True, show_default=True,
              help="After the counted ids, every other id in the tokenizer's merge order (so any N fits).")
def draft_vocab(model, texts, out, fill):
    """Write a reduced-vocabulary frequency file for --spec-draft-vocab N from text: the token ids of MODEL's
    tokenizer ranked by their count in the --from files (FR-Spec)."""
    from .draft_vocab import text_ranks, write_ranks

    ids, n_tokens, counted = text_ranks(model, texts, fill)
    if not counted:
        raise NextnError(f"{', '.join(texts)}: no tokens to count (the text files are empty)")
    rest = ", then the tokenizer's merge order" if fill else ""
    try:
        write_ranks(out, ids, f"nextn draft-vocab: token frequencies of {len(texts)} text file(s) "
                              f"({n_tokens} tokens, {counted} distinct ids){rest}; most frequent first")
    except OSError as e:
        raise NextnError(f"{out}: cannot write the rank file ({e.strerror})") from None
    click.echo(f"{out}: {len(ids)} token ids ({counted} counted in {n_tokens} tokens of {len(texts)} file(s)){rest}",
               err=True)


from .cli_serve import register as _register_serve  # noqa: E402
from .cli_tune import register as _register_tuning  # noqa: E402

_register_tuning(cli)
_register_serve(cli)


def main(argv=None):
    try:
        cli.main(args=argv, prog_name="nextn", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("nextn: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except NextnError as e:
        click.echo(f"nextn: error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("nextn: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
