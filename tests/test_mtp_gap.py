"""The NextN gap folded into draft step 0 (issue 34, item 3): `mtp_draft`'s head runs on its `out_ids` rows only
(compiler/graphs.py `select_head_rows`). On each arch's BF16 fixture (the references' build)."""
import numpy as np
import pytest

import nextn.runtime as rt
from conftest import FIXTURES, reference

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
