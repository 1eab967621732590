"""The NextN gap folded into draft step 0 (issue 34, item 3): `mtp_draft`'s head runs on its `out_ids` rows only
(compiler/graphs.py `select_head_rows`), and `Drafter` writes a gap of up to max_draft rows in the draft-step-0 call
instead of an `mtp_rows` call first (runtime/speculative.py). On each arch's BF16 fixture (the references' build)."""
import numpy as np
import pytest

import nextn.runtime as rt
from conftest import FIXTURES, reference
from nextn.runtime.sampling import CounterRNG, SamplerChain
from nextn.runtime.speculative import Drafter

ARCHS = {"glm4moe": ("bf16", FIXTURES / "tiny-glm4moe" / "tiny-glm4moe-BF16.gguf"),
         "glm-dsa": ("dsa-bf16", FIXTURES / "tiny-glm-dsa" / "tiny-glm-dsa-BF16.gguf"),
         "glm5next": ("g5n-bf16", FIXTURES / "tiny-glm5next" / "tiny-glm5next-BF16.gguf")}
N_CTX = 256


@pytest.fixture(scope="module", params=sorted(ARCHS))
def arch(request, compiled):
    name, path = ARCHS[request.param]
    ids = np.asarray(reference(path.parent)["prompts"][0]["prompt_ids"][:24], np.int32)
    return rt.load(compiled(name, path), ctx_size=N_CTX), ids


def _teacher_forced(seq, ids):
    """h_prev of every prompt row: the trunk's post-norm hidden of the row before (zeros at 0)."""
    h = seq.hidden(ids)
    return np.concatenate([np.zeros((1, h.shape[1]), np.float32), h[:-1]])


def _nextn_states(seq) -> dict:
    return {n: s.numpy().copy() for n, s in seq.states.items() if n.startswith("nextn.")}


def test_selected_rows_equal_the_every_row_calls_rows(arch):
    """mtp_draft with `out_ids` returns exactly (bit for bit) the asked rows of the same call with every row asked,
    the same h_nextn for every row, and argmax = numpy's argmax of the rows it returns."""
    m, ids = arch
    seq = m.sequence
    hp = _teacher_forced(seq, ids)
    seq.mtp_rows(ids[:16], hp[:16], 0)
    t, h, p0 = ids[16:20], hp[16:20], 16
    h_all, lg_all, am_all = seq.mtp_draft(t, h, p0)
    lg_all = lg_all.numpy()
    assert lg_all.shape == (4, seq.model.hparams["n_vocab"])
    for rows in ([3], [0, 2], [1, 2, 3]):
        h_sel, lg, am = seq.mtp_draft(t, h, p0, out_ids=rows)   # the same cells written again with the same rows
        lg = lg.numpy()
        assert lg.shape == (len(rows), seq.model.hparams["n_vocab"])
        assert np.array_equal(lg, lg_all[rows]), rows
        assert am.tolist() == am_all[rows].tolist() == np.argmax(lg, axis=1).tolist()
        assert np.array_equal(h_sel, h_all)


@pytest.mark.parametrize("gap", [2, 3])
def test_fused_gap_equals_mtp_rows_then_draft_step(arch, gap):
    """A gap of `gap` accepted rows + id_last written in the draft-step-0 call gives the NextN KV (and the glm-dsa /
    glm5next stored selection) and the drafts of the old path (the gap by `mtp_rows`, then a one-row step 0): bit for
    bit but for id_last's row of glm5next's indexer keys (below). Two sequences of one model, the same rows."""
    m, ids = arch
    P0, k = 12, 3
    out = {}
    for fuse in (True, False):
        seq = m.loaded.new_sequence(N_CTX)
        hp = _teacher_forced(seq, ids)
        seq.mtp_rows(ids[:P0], hp[:P0], 0)
        for name in ("mtp_rows", "mtp_draft", "draft", "mtp_draft_shared"):
            seq.vm_seconds[name] = 0.0
        d = Drafter(seq, SamplerChain(temp=0.0), CounterRNG(0), False, 0, 0.0)
        if not fuse:
            d.fuse_rows = 2   # the old limit: a gap of 2+ rows went in by mtp_rows first
        n_past = P0 + gap
        d.add_rows(ids[P0:n_past], hp[P0:n_past], P0)
        d.add_rows(ids[n_past:n_past + 1], hp[n_past:n_past + 1], n_past)
        assert d.fuse_rows >= gap + 1 or not fuse
        drafts, _q = d.propose(n_past, k)
        calls = {n for n, s in seq.vm_seconds.items() if s > 0}
        out[fuse] = drafts, _nextn_states(seq), calls
    (d_new, st_new, c_new), (d_old, st_old, c_old) = out[True], out[False]
    assert "mtp_rows" in c_old and "mtp_rows" not in c_new and "mtp_draft" in c_new   # one NextN call fewer
    assert len(d_new) == k and d_new == d_old
    assert st_new.keys() == st_old.keys() and st_new
    n_past = P0 + gap
    for name in st_new:
        new, old = st_new[name], st_old[name]
        if new.shape[0] != N_CTX:          # not per cell (none today): whole
            assert np.array_equal(new, old), name
            continue
        rest = np.r_[0:n_past, n_past + 1:N_CTX]
        assert np.array_equal(new[rest], old[rest]), name   # the gap's rows: mtp_rows' bits; the drafts' rows
        # id_last's row: the old path wrote it by the one-row static `draft` entry, the fused path as a row of a
        # multi-row mtp_draft; glm5next's indexer keys (nextn.ik) round differently there by 1.2e-7 (1 ulp at
        # |x| ~ 1, max |x| 3.4); glm4moe's and glm-dsa's states are equal bit for bit.
        np.testing.assert_allclose(new[n_past], old[n_past], rtol=0, atol=1e-6 * np.abs(old[n_past]).max(),
                                   err_msg=name)


def test_fixed_depth_rounds_call_no_mtp_rows(arch):
    """A round of n_max drafts that all pass leaves n_max gap rows + id_last: max_draft + 1 rows, within the fused
    call's limit, so fixed-depth speculation calls no `mtp_rows` after the prompt's warm-up (before: every round
    after one that accepted 2+ drafts did); greedy output equals plain decoding."""
    m, ids = arch
    plain = m.generate(ids.tolist(), 24, spec_type="none", ignore_eos=True)
    spec = m.generate(ids.tolist(), 24, n_max=3, ignore_eos=True)
    assert spec.ids == plain.ids
    assert spec.stats.accepted_at[1] > 0          # some round left a gap of 2+ rows
    assert spec.vm_s.get("mtp_rows", 0.0) == 0.0 and spec.vm_s["mtp_draft"] > 0
