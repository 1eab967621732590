"""`nextn serve` (registered on the main CLI group): llama-server's flag names (tools/server/README.md, common/arg.cpp)."""
from __future__ import annotations

import click

from nextn.common.errors import NextnError

from .cli_options import (draft_vocab_options, kv_cache_options, mtp_index_share_option, parse_n_max, spec_options,
                          threads_option)


def register(cli: click.Group) -> None:
    cli.add_command(serve)


@click.command()
@click.argument("model", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; several: comma-separated (e.g. 127.0.0.1,::1).")
@click.option("--port", default=8080, show_default=True, help="Port to listen on.")
@click.option("-c", "--ctx-size", default=None, type=int,
              help="Context size in KV cells, shared by the slots: each slot holds c / np "
                   "[default: min(train ctx, 4096) per server].")
@click.option("-b", "--batch-size", "n_batch", default=2048, show_default=True, type=click.IntRange(min=1),
              help="Evaluate a prompt in batches of this many tokens (llama-server's logical batch; return_progress "
                   "reports each).")
@click.option("-kvu", "--kv-unified", is_flag=True,
              help="One pool of c cells for all slots (llama-server): each slot may fill it; when the slots together "
                   "would pass c, idle slots' caches are dropped first, else every busy request fails (500). Each "
                   "slot still allocates c cells here (np x c in memory).")
@click.option("-np", "--parallel", "n_parallel", default=1, show_default=True,
              help="Slots: requests decoded at once, each with its own KV and speculation state; more requests queue.")
@threads_option
@spec_options
@draft_vocab_options
@click.option("-n", "--n-predict", default=-1, show_default=True, help="Default tokens per request (-1: until the "
                                                                         "context is full).")
@click.option("--temp", default=0.8, show_default=True, help="Default temperature (0 = greedy).")
@click.option("--top-k", default=40, show_default=True, help="Default top-k (0: off).")
@click.option("--top-p", default=0.95, show_default=True, help="Default top-p (1.0: off).")
@click.option("--min-p", default=0.05, show_default=True, help="Default min-p (0.0: off).")
@click.option("-s", "--seed", default=-1, show_default=True, help="Default seed (-1: random per request).")
@click.option("-sps", "--slot-prompt-similarity", "similarity", default=0.1, show_default=True, type=float,
              help="Give a request the idle slot whose prompt cache shares at least this fraction of its prompt as a "
                   "common prefix (0: off, least recently used slot).")
@click.option("--reasoning-format", default="auto", show_default=True, type=click.Choice(["none", "deepseek", "auto"]),
              help="Chat replies: <think>...</think> returned as reasoning_content (deepseek, auto) or left in the "
                   "content (none); a request's reasoning_format overrides it.")
@click.option("--reasoning-budget", default=-1, show_default=True, type=click.IntRange(-1, 0),
              help="Thinking budget: -1 unlimited, 0 off (the template's enable_thinking false unless a request "
                   "sets it).")
@click.option("--cors-origins", default="*", show_default=True,
              help="Origins whose browser requests may read the answers (comma-separated; *: every origin).")
@click.option("--slot-save-path", default=None, type=click.Path(file_okay=False, exists=True),
              help="Folder for POST /slots/{id}?action=save|restore files (slot prompt caches).")
@click.option("-cram", "--cache-ram", default=8192, show_default=True, type=click.IntRange(min=-1),
              help="Host-memory prompt cache in MiB (-1: no limit, 0: off): a slot's KV is kept there when the slot "
                   "gets another prompt, and restored for a later prompt that shares its prefix.")
@click.option("--cache-idle-slots/--no-cache-idle-slots", default=True, show_default=True,
              help="Save idle slots to the prompt cache when a task starts (with --kv-unified: and clear them); needs "
                   "--cache-ram.")
@click.option("-v", "--verbose", is_flag=True, help="Every answer carries `__verbose` (the /completion object, its "
                                                    "prompt text included), as a request's \"verbose\": true asks; "
                                                    "the log gets the slots' prompt-cache events.")
@click.option("--sleep-idle-seconds", default=-1, show_default=True, type=int,
              help="Unload the model after this many idle seconds and reload it when a request needs it (-1: never; "
                   "/health, /props, /models and /metrics answer while asleep without waking it).")
@click.option("--metrics", is_flag=True, help="Enable the Prometheus /metrics endpoint.")
@click.option("--no-slots", is_flag=True, help="Disable the /slots endpoint.")
@click.option("--api-key", "api_keys", multiple=True,
              help="API key clients must send (Authorization: Bearer KEY); repeatable or comma-separated.")
@click.option("--chat-template", default=None,
              help="Chat template: a built-in name (chatml, llama3, command-r, chatglm3, chatglm4, glmedge: "
                   "llama.cpp's formats of role and text) or Jinja text; wins over --chat-template-file.")
@click.option("--chat-template-file", default=None, type=click.Path(dir_okay=False),
              help="Jinja chat template [default: the GGUF's tokenizer.chat_template, else nextn's GLM-4.5 one].")
@click.option("-a", "--alias", default=None, help="Model names, comma-separated: the first in sorted order is the name "
                                                  "in responses and /v1/models [default: file name].")
@click.option("--tags", default=None, help="Model tags, comma-separated (informational: /v1/models).")
@click.option("-md", "--model-draft", "draft", default=None, help="MTP-only GGUF (draft) for a trunk-only model.")
@kv_cache_options
@click.option("--device", default="cpu", show_default=True, help="Where to run: cpu, or cuda:N for a CUDA artifact.")
@click.option("--target", default="llvm", show_default=True, help="Target used when MODEL is a GGUF.")
@click.option("--arch", "arches", multiple=True, help="GPU arch(s) when MODEL is a GGUF compiled for cuda/rocm.")
@click.option("--mtp-dense-attention", is_flag=True, help="glm-dsa: compile the NextN block as dense MLA (a GGUF).")
@mtp_index_share_option
def serve(model, host, port, ctx_size, n_batch, kv_unified, n_parallel, threads, spec_type, spec_draft_n_max,
          spec_draft_n_min, spec_draft_p_min, spec_draft_sampling, spec_draft_vocab, spec_draft_vocab_file, n_predict,
          temp, top_k, top_p, min_p, seed, similarity, reasoning_format, reasoning_budget, cors_origins, slot_save_path,
          cache_ram, cache_idle_slots, sleep_idle_seconds, verbose, metrics, no_slots, api_keys, chat_template,
          chat_template_file, alias, tags,
          draft, cache_type_k, cache_type_v, device, target, arches, mtp_dense_attention, mtp_index_share):
    """Serve MODEL (a GGUF, compiled and cached on first use, or an artifact directory) over HTTP, as llama-server:
    /v1/chat/completions, /v1/completions, /completion, /tokenize, /detokenize, /apply-template, /health, /props,
    /v1/models, /slots, /metrics; Anthropic's /v1/messages (+ /v1/messages/count_tokens); OpenAI's /v1/responses."""
    from nextn.common.compile_options import CompileOptions

    from .server import ServeOptions, serve as run_server
    from .server.params import ServerDefaults

    if n_parallel < 1:
        raise NextnError(f"-np {n_parallel}: expected >= 1")
    if ctx_size is not None and (ctx_size if kv_unified else ctx_size // n_parallel) < 2:
        raise NextnError(f"-c {ctx_size} -np {n_parallel}: each slot needs at least 2 cells")
    if n_predict < -1:
        raise NextnError(f"-n {n_predict}: expected -1 (no limit) or >= 0")
    if spec_draft_n_min < 0 or not 0.0 <= spec_draft_p_min <= 1.0:
        raise NextnError(f"--spec-draft-n-min {spec_draft_n_min} / --spec-draft-p-min {spec_draft_p_min}: expected "
                         f"n_min >= 0 and 0 <= p_min <= 1")
    if not 0.0 <= similarity <= 1.0:
        raise NextnError(f"--slot-prompt-similarity {similarity}: expected a fraction in [0, 1]")
    if sleep_idle_seconds == 0 or sleep_idle_seconds < -1:
        raise NextnError(f"--sleep-idle-seconds {sleep_idle_seconds}: expected -1 (never) or > 0")
    keys = [k for a in api_keys for k in a.split(",") if k]
    d = ServerDefaults(n_predict=n_predict, temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                       n_max=parse_n_max(spec_draft_n_max), n_min=spec_draft_n_min, p_min=spec_draft_p_min,
                       draft_sampling=spec_draft_sampling, reasoning_format=reasoning_format,
                       reasoning_budget=reasoning_budget, verbose=verbose)
    options = CompileOptions(target=target, arches=arches, mtp_dense_attention=mtp_dense_attention,
                             cache_type_k=cache_type_k, cache_type_v=cache_type_v, draft_vocab=spec_draft_vocab)
    opt = ServeOptions(model=model, host=host, port=port, ctx_size=ctx_size, n_batch=n_batch, kv_unified=kv_unified,
                       n_parallel=n_parallel, threads=threads,
                       draft=draft, device=device, compile_options=options, mtp_index_share=mtp_index_share,
                       chat_template=chat_template, chat_template_file=chat_template_file, api_keys=keys,
                       metrics=metrics, slots=not no_slots, alias=alias, tags=tags,
                       spec_type=spec_type, slot_prompt_similarity=similarity,
                       cors_origins=tuple(o.strip() for o in cors_origins.split(",") if o.strip()),
                       slot_save_path=slot_save_path, cache_ram=cache_ram, cache_idle_slots=cache_idle_slots,
                       sleep_idle_seconds=sleep_idle_seconds, defaults=d,
                       draft_vocab_file=spec_draft_vocab_file)
    run_server(opt, log=lambda s: click.echo(s, err=True))
