"""The x86 knob search on a fake clock: noise cannot pick a loser, a really faster knob set is kept; the schema 4 log
(per row count before / after, kept or default) round-trips, old logs still read, and compile applies the knobs."""
import copy
import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import G4

from nextn.common.errors import NextnError
from nextn.compiler.lower import x86
from nextn.compiler.tune import decide
from nextn.compiler.tune import knobs as kn
from nextn.compiler.tune import log as tlog

pytestmark = pytest.mark.slow   # tuned kernel builds

MODEL = G4 / "tiny-glm4moe-Q8_0.gguf"
SPEC = x86.KernelSpec("matmul", "q8_0", 256, 256, 1)         # the tiny model's one-row attention projections
SPEC_T = x86.KernelSpec("matmul", "q8_0", 256, 256, None)    # the same, symbolic rows (verify, prefill)
W = 32                                                       # search as on an AVX2 CPU, whatever this one has


class Clock:
    """Seconds per call of a knob set: `base(knobs, rows)` times a multiplicative noise of `noise` (lognormal,
    seeded), and `lucky` knob sets that time `lucky_x` faster on their first timing only (the one timing that
    used to decide)."""

    def __init__(self, base, noise=0.04, lucky=(), lucky_x=0.5, seed=0):
        self.base, self.noise, self.lucky, self.lucky_x = base, noise, set(lucky), lucky_x
        self.rng = np.random.default_rng(seed)
        self.calls: dict = {}

    def __call__(self, knobs, rows):
        n = self.calls[(knobs, rows)] = self.calls.get((knobs, rows), 0) + 1
        t = self.base(knobs, rows) * float(np.exp(self.rng.normal(0, self.noise)))
        return t * self.lucky_x if knobs in self.lucky and n == 1 else t


def _default(spec=SPEC):
    return x86.default_knobs(spec, W)


def test_a_lucky_timing_is_rejected_and_a_faster_knob_set_kept():
    d = _default()
    lucky = dataclasses.replace(d, tile_n=64)            # looks 2x faster once, is as fast as the default
    fast = lambda kb: kb.tile_n == 32                    # noqa: E731  every set with tile_n 32 is 15 % faster
    clock = Clock(lambda kb, r: 1e-3 * (0.85 if fast(kb) else 1.0), lucky=[lucky])
    spec = dataclasses.replace(SPEC, exact=True)         # the float kernel
    res = kn.search(spec, W, clock, [1], rounds=5)
    assert res.outcome.kept and res.knobs.tile_n == 32 and res.default == d
    assert 1.08 < res.outcome.speedup < 1.3 and res.outcome.noise > 0
    # the lucky set went to the final rounds (it screened best) and lost there
    assert clock.calls[(lucky, 1)] > 1
    out = decide.interleaved(clock, d, [lucky], [1], 5)[lucky]
    assert not out.kept and out.speedup < 1.05
    # every knob of the space was screened: sum(values - 1) sets plus the default, none failed to build
    sp = kn.space(spec, W)
    assert res.tried == 1 + sum(len(v) - 1 for v in sp.values()) and res.failed == 0
    # the knobs that change a row's bits stay at the default (x86.bit_knobs): the float path's width and unroll
    assert sp["width"] == (d.width,) and sp["unroll"] == (d.unroll,) and len(sp["tile_n"]) > 1


def test_noise_larger_than_the_gain_keeps_the_default():
    d = _default()
    # 3 % faster, but the machine's timings move by ~8 %: no record may claim it
    res = kn.search(SPEC, W, Clock(lambda kb, r: 1e-3 * (0.97 if kb.tile_n == 32 else 1.0), noise=0.08), [1])
    assert not res.outcome.kept
    assert res.outcome.noise > 0.03
    # the same gain on a quiet machine is still under MIN_GAIN: kept only from 2 % up, so 3 % passes when quiet
    quiet = kn.search(SPEC, W, Clock(lambda kb, r: 1e-3 * (0.97 if kb.tile_n == 32 else 1.0), noise=0.002), [1])
    assert quiet.outcome.kept and quiet.knobs.tile_n == 32 and quiet.default == d


def test_faster_at_prefill_but_slower_at_verify_rows_keeps_the_default():
    d = _default(SPEC_T)
    rows = kn.rows_for(SPEC_T, prefill=True)
    assert rows == [2, 3, 4, 512]

    rg = next(v for v in kn.space(SPEC_T, W)["row_group"] if v != d.row_group)

    def base(kb, r):   # another row group: a prefill chunk 2x faster, but 2-4 verify rows 12 % slower
        if kb.row_group == rg:
            return 1e-3 * r * (0.5 if r == 512 else 1.12)
        return 1e-3 * r

    res = kn.search(SPEC_T, W, Clock(base, noise=0.01), rows)
    assert not res.outcome.kept
    assert res.outcome.speedup > 1 and min(res.outcome.speedups) < 0.95   # the log shows why: per row count
    # a kernel prefill does not call with the prompt's rows (the lm head) is timed at the verify rows only
    assert kn.rows_for(SPEC_T, prefill=False) == [2, 3, 4] and kn.rows_for(SPEC, prefill=True) == [1]


def test_a_knob_set_that_fails_to_build_is_counted_not_fatal():
    def base(kb, r):
        if kb.tile_n == 8:
            raise RuntimeError("cannot build")
        return 1e-3
    res = kn.search(SPEC, W, Clock(base, noise=0.0), [1])
    assert res.failed == 1 and not res.outcome.kept


def test_the_space_follows_the_knobs_dataclass():
    """Every x86.Knobs field is searched (new fields at their `choices` metadata, else the default only)."""
    names = [f.name for f in dataclasses.fields(x86.Knobs)]
    sp = kn.space(SPEC_T, W)
    assert list(sp) == names
    d = _default(SPEC_T)
    assert all(getattr(d, n) in sp[n] for n in names)
    assert set(sp["row_group"]) == {2, 4, 8} and kn.space(SPEC, W)["row_group"] == (d.row_group,)
    # w_rows only where the row functions take several weight rows (IQ4_XS, the K-quants' verify cross pairs and
    # the grouped 32-block formats, Q8_0 among them; not the codebook formats or the float path)
    assert set(sp["w_rows"]) == {1, 2}
    for kind in ("iq4_xs", "q4_k"):
        assert set(kn.space(x86.KernelSpec("matmul", kind, 256, 256, None), W)["w_rows"]) == {1, 2}
    for kind in ("iq2_xxs", "bf16"):
        one = x86.KernelSpec("matmul", kind, 256, 256, None)
        assert kn.space(one, W)["w_rows"] == (_default(one).w_rows,)


class FakeBench:
    """knobs.KernelBench's interface on a fake clock: tile_n 32 is 20 % faster on every kernel."""

    def __init__(self, spec, target):
        self.clock = Clock(lambda kb, r: 1e-4 * r * (0.8 if kb.tile_n == 32 else 1.0), noise=0.01)

    def time(self, knobs, rows):
        return self.clock(knobs, rows)


KEY_RE = r"^x86\.matmul:q8_0/q8_0:N256:K256:rows(1|T)$"


@pytest.fixture(scope="module")
def fake_log(tmp_path_factory):
    from nextn.compiler.tune.run import tune_model

    d = tmp_path_factory.mktemp("tlog")
    msgs = []
    book = tune_model(str(MODEL), str(d), only=KEY_RE, progress=False, log=msgs.append, bench=FakeBench, rounds=3)
    return d, book, msgs


def test_the_log_records_before_after_and_round_trips(fake_log):
    from nextn.compiler.target import make_target

    d, book, msgs = fake_log
    assert book["schema"] == 4 and tlog.read(str(d)) == book
    recs = {r["key"]: r for r in book["x86_knobs"]}
    assert set(recs) == {"x86.matmul:q8_0/q8_0:N256:K256:rows1", "x86.matmul:q8_0/q8_0:N256:K256:rowsT"}
    one, many = recs["x86.matmul:q8_0/q8_0:N256:K256:rows1"], recs["x86.matmul:q8_0/q8_0:N256:K256:rowsT"]
    assert one["rows"] == [1] and many["rows"] == [2, 3, 4, 512]   # the tiny model's prefill calls it with T rows
    for r in (one, many):
        assert r["kept"] and r["knobs"]["tile_n"] == 32 and r["rounds"] == 3
        # no other knob changed: the others buy nothing on this clock, so a simpler record within the noise wins
        dk = dataclasses.asdict(x86.default_knobs(SPEC, r["knobs"]["width"], x86.l1d_kb(make_target("llvm"))))
        assert {k: v for k, v in r["knobs"].items() if dk[k] != v} == {"tile_n": 32}, r["knobs"]
        assert all(0.75 < t / dd < 0.85 for t, dd in zip(r["run_secs"], r["default_secs"]))
        assert all(1.15 < s < 1.35 for s in r["speedups"]) and 0 <= r["noise"] < 0.05
    line = next(m for m in msgs if "x86.matmul:q8_0/q8_0:N256:K256:rows1:" in m)
    assert re.search(r"rows 1: default 0\.(099|100) ms, best 0\.0(79|80|81) ms \(x1\.\d+\)", line), line
    assert "kept {'tile_n': 32}" in line, line
    # resumable: nothing left to do
    from nextn.compiler.tune.run import tune_model

    msgs2 = []
    tune_model(str(MODEL), str(d), only=KEY_RE, progress=False, log=msgs2.append, bench=FakeBench, rounds=3)
    assert any(m.startswith("0 x86 kernel(s) to tune") for m in msgs2), msgs2
    # `tuning show` prints each kernel's before / after in ms and the ratio
    show = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "tuning", "show", str(d)], capture_output=True,
                          text=True)
    assert show.returncode == 0 and "x86.matmul:q8_0/q8_0:N256:K256:rowsT" in show.stdout
    m = re.search(r"rows 512: (\d+\.\d+) -> (\d+\.\d+) \(x(\d\.\d+)\)", show.stdout)
    assert m and 50 < float(m[1]) < 52 and 40 < float(m[2]) < 42 and 1.15 < float(m[3]) < 1.35, show.stdout
    assert "kept [" in show.stdout


def test_a_log_older_than_fit_kb_takes_the_targets_default(fake_log, tmp_path):
    """Knobs.fit_kb came after schema 4 logs were written: a record without it loads, keeps its other knobs and
    takes the compile default's (from the target's L1, x86.l1d_kb, at its vector width)."""
    from nextn.compiler.target import make_target
    from nextn.compiler.tune.apply import x86_knobs

    d, book, _ = fake_log
    old = copy.deepcopy(book)
    for r in old["x86_knobs"]:
        del r["knobs"]["fit_kb"]
    tlog.write(old, str(tmp_path / "old"))
    tgt = make_target("llvm")
    got = x86_knobs(str(tmp_path / "old"), tgt)(SPEC)
    want = x86.default_knobs(SPEC, x86.vector_width(tgt), x86.l1d_kb(tgt)).fit_kb
    assert got.tile_n == 32 and got.fit_kb == want


def test_default_kept_records_are_not_applied_and_merge_prefers_kept(fake_log, tmp_path):
    from nextn.compiler.target import make_target
    from nextn.compiler.tune.apply import x86_knobs

    d, book, _ = fake_log
    tgt = make_target("llvm")
    width = x86.vector_width(tgt)
    spec = x86.KernelSpec("matmul", "q8_0", 256, 256, 1)
    assert x86_knobs(str(d), tgt)(spec) == dataclasses.replace(x86.default_knobs(spec, width, x86.l1d_kb(tgt)),
                                                               tile_n=32)
    lost = copy.deepcopy(book)
    for r in lost["x86_knobs"]:
        r["kept"], r["speedups"] = False, [0.9] * len(r["rows"])
    tlog.write(lost, str(tmp_path / "lost"))
    assert x86_knobs(str(tmp_path / "lost"), tgt)(spec) is None          # the default stays
    merged = tlog.merge([tlog.read(str(tmp_path / "lost")), book])
    assert all(r["kept"] for r in merged["x86_knobs"]) and len(merged["x86_knobs"]) == 2


def test_earlier_schemas_are_refused_in_one_line(fake_log, tmp_path):
    """Schemas 1-3 were never in a release (their kernel keys did not say which of a kind's kernels they tuned):
    such a log is refused in one line naming the file, its schema and the one this nextn reads, for compile and
    `nextn tuning show` alike."""
    _d, book, _ = fake_log
    for schema in (1, 2, 3):
        d = tmp_path / f"s{schema}"
        d.mkdir()
        (d / "log.json").write_text(json.dumps(dict(copy.deepcopy(book), schema=schema)))
        with pytest.raises(NextnError, match=rf"log.json: tuning log schema {schema}, this nextn reads schema 4;"):
            tlog.read(str(d))
        show = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "tuning", "show", str(d)],
                              capture_output=True, text=True)
        assert show.returncode == 1 and "Traceback" not in show.stderr, show.stderr
        assert f"tuning log schema {schema}, this nextn reads schema 4" in show.stderr + show.stdout


def test_row_bit_knobs_of_a_record_are_not_applied(fake_log, tmp_path):
    """A kept record applies its knobs to its kernel, except a knob that changes the kernel's row bits (the float
    path's unroll: x86.bit_knobs), which keeps the default and is said in one line; records of other kernels
    (Q4_K on q8 rows, routed F16 experts) apply as they are."""
    from nextn.compiler.target import make_target
    from nextn.compiler.tune.apply import x86_knobs

    _d, book, _ = fake_log
    tgt = make_target("llvm")
    width = x86.vector_width(tgt)      # this CPU's: a record's other width would not apply (x86.bit_knobs)
    rec = next(r for r in book["x86_knobs"] if r["key"].endswith("rows1"))

    def at(key, **knobs):
        return dict(copy.deepcopy(rec), key=key, knobs={"width": width, **knobs})

    log = dict(copy.deepcopy(book), x86_knobs=[
        at("x86.matmul:q8_0/f32:N256:K256:rows1", unroll=4, tile_n=64),
        at("x86.matmul:q4_k/q8:N4096:K4096:rows1", tile_n=64),
        at("x86.matmul_id:f16/f32:N64:K256:rowsT:X4:used2:shared:w2", row_group=4)])
    d = tmp_path / "log"
    d.mkdir()
    (d / "log.json").write_text(json.dumps(log))
    msgs = []
    knobs_for = x86_knobs(str(d), tgt, msgs.append)
    assert knobs_for(SPEC) is None                                      # the integer Q8_0 kernel: its defaults
    exact = knobs_for(x86.KernelSpec("matmul", "q8_0", 256, 256, 1, exact=True))
    assert (exact.width, exact.unroll, exact.tile_n) == (width, x86.Knobs().unroll, 64)
    assert knobs_for(x86.KernelSpec("matmul", "q4_k", 4096, 4096, 1)).tile_n == 64
    moe = x86.KernelSpec("matmul_id", "f16", 64, 256, None, X=4, n_used=2, shared_x=True, n_weights=2)
    assert knobs_for(moe).row_group == 4
    (bits,) = msgs
    assert bits.startswith("tuning log: x86.matmul:q8_0/f32:N256:K256:rows1: unroll=4 not applied") and \
        f"kept unroll={x86.Knobs().unroll}" in bits, bits


def test_bad_knob_records_get_one_line(fake_log, tmp_path):
    _d, book, _ = fake_log
    cases = {}
    bad = copy.deepcopy(book)
    bad["x86_knobs"][0]["knobs"]["warp_size"] = 32
    cases["newknob.json"] = (bad, "'warp_size' is not a knob")
    bad = copy.deepcopy(book)
    bad["x86_knobs"][0]["rows"] = [1, 2]
    cases["rows.json"] = (bad, "one entry per row count")
    bad = copy.deepcopy(book)
    bad["x86_knobs"][0]["kept"] = "yes"
    cases["kept.json"] = (bad, "'kept' must be true or false")
    bad = copy.deepcopy(book)
    del bad["x86_knobs"][0]["noise"]
    cases["schema.json"] = (bad, "(schema 4)")
    for name, (data, want) in cases.items():
        p = tmp_path / name
        p.write_text(json.dumps(data))
        with pytest.raises(NextnError, match=want.replace("(", r"\(").replace(")", r"\)")):
            tlog.read(str(p))
        r = subprocess.run([sys.executable, "-m", "nextn.runtime.cli", "tuning", "import", str(p), "-o",
                            str(tmp_path / "dst")], capture_output=True, text=True)
        assert r.returncode == 1 and "Traceback" not in r.stderr and name in r.stderr, (name, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


def test_compile_with_the_log_builds_the_kernels_with_its_knobs(fake_log):
    """The lowering compile uses (compile.py: for_target(knobs_for=x86_knobs(log))) builds each logged kernel
    with the log's knobs: the same PrimFunc as the spec built with them, not the default one."""
    import tvm_ffi

    from nextn.compiler.target import make_target
    from nextn.compiler.tune.apply import x86_knobs
    from nextn.compiler.tune.workloads import lowered_module

    d, book, _ = fake_log
    tgt = make_target("llvm")
    width = x86.vector_width(tgt)
    mod, _x = lowered_module(str(MODEL), tgt)
    from nextn.compiler.graphs import SPLIT_L, STATIC, build_graphs, weight_kinds
    from nextn.compiler.loader.model_files import ModelFiles
    from nextn.compiler.lower.to_relax import build_module
    from nextn.compiler.lower.x86.emit import for_target

    mf = ModelFiles(str(MODEL), None, load_mtp=False)
    graphs = build_graphs(mf, mf.has_nextn)
    lower = for_target(tgt, knobs_for=x86_knobs(str(d), tgt))
    tuned = build_module(list(graphs.values()), weight_kinds(mf, graphs.values()), STATIC, form="cpu",
                         split_l=SPLIT_L, x86=lower)
    for spec in (SPEC, SPEC_T):
        rec = next(r for r in book["x86_knobs"] if r["key"] == spec.key)
        assert rec["knobs"] != dataclasses.asdict(x86.default_knobs(spec, width))
        want = spec.build(x86.Knobs(**rec["knobs"]), x86.has_vnni(tgt, rec["knobs"]["width"]))
        same = lambda f: tvm_ffi.structural_equal(f.without_attr("op_pattern").without_attr("global_symbol"),  # noqa: E731
                                                  want.without_attr("global_symbol"), map_free_vars=True)
        assert same(tuned[spec.name]) and not same(mod[spec.name])
