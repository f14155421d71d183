"""openinfer.sglang against the installed SGLang: the backend is built by
SGLang's own storage factory (its `dynamic` path), registered on SGLang's own
host KV pool objects (on the CPU) and round-trips pages byte-exact; failures
come back as False / None / misses."""
import hashlib
import pathlib
import re
import time

import pytest
import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
from sglang.srt.mem_cache.storage import StorageBackendFactory

import openinfer as oi
from openinfer import sglang as oisgl

from conftest import (DIM, PAGE, PAGES, fill_random, host_pool, indices, keys, mla_host_pool,
                      page_bytes, storage_config)

LAYOUTS = ["page_first", "page_first_direct", "page_head", "layer_first"]


def make(pool, extra=None, **cfg):
    """What SGLang's cache controller does on attach: the factory builds the
    backend, then registers the host pool."""
    config = storage_config(dict({"pool_bytes": 16 << 20}, **(extra or {})), **cfg)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    return backend


def test_factory_builds_the_backend():
    pool = host_pool()
    b = make(pool)
    try:
        assert isinstance(b, oisgl.OpenInferStorage)
        assert isinstance(b, HiCacheStorage)
        assert b.mode == "embedded"
        assert re.fullmatch(r"sglang/model-[0-9a-f]{16}/mha-h2-d64-L4-p16-bfloat16-page_first/"
                            r"tp0-1", b.namespace), b.namespace
        assert b.geom.page_bytes == 2 * 4 * PAGE * 2 * 64 * 2
        assert [a[0] for a in b.geom.arenas] == ["k", "v"]
    finally:
        b.close()


def test_factory_refuses_a_bad_mode():
    config = storage_config({"mode": "nope"})
    with pytest.raises(ValueError, match="'mode' is 'nope'"):
        StorageBackendFactory.create_backend("dynamic", config, None)


BAD_OPTIONS = [
    ({"pool_bytes": "-1G"}, "pool_bytes", "'-1G'"),
    ({"pool_bytes": "lots"}, "pool_bytes", "'lots'"),
    ({"pool_bytes": 0}, "pool_bytes", "is 0;"),
    ({"staging_pages": 0}, "staging_pages", "is 0;"),
    ({"staging_pages": "many"}, "staging_pages", "'many'"),
    ({"timeout_s": -1}, "timeout_s", "is -1;"),
    ({"timeout_s": "abc"}, "timeout_s", "'abc'"),
    ({"control_deadline_ms": -5}, "control_deadline_ms", "is -5;"),
    ({"probe_interval_ms": "x"}, "probe_interval_ms", "'x'"),
    ({"namespace": ""}, "namespace", "is '';"),
    ({"codec": "zstd"}, "codec", "'zstd'"),
    ({"pool_size": "1G"}, "pool_size", "unknown option"),
]


@pytest.mark.parametrize("extra,key,shown", BAD_OPTIONS,
                         ids=["%s=%r" % next(iter(b[0].items())) for b in BAD_OPTIONS])
def test_a_bad_option_fails_when_the_factory_builds_the_backend(extra, key, shown):
    """Each bad value fails in SGLang's storage factory, before any pool is
    registered, with an error that names the key and the value; SGLang's
    own keys of the same extra_config are accepted."""
    from openinfer._config import ConfigError
    with pytest.raises(ConfigError) as ei:
        StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    msg = str(ei.value)
    assert "'%s'" % key in msg and shown in msg, msg
    assert ei.value.key == key
    assert ("allowed:" in msg) != (shown == "unknown option"), msg


def test_good_options_parse():
    b = StorageBackendFactory.create_backend("dynamic", storage_config(
        {"pool_bytes": "32M", "staging_pages": "4", "timeout_s": "2.5", "retry_s": 0,
         "control_deadline_ms": "1500", "lookup_deadline_ms": 20, "probe_interval_ms": "250",
         "mode": "SIDECAR", "enable_metadata_cache": True, "file_storage_path": "/tmp"}), None)
    try:
        o = b.options
        assert (o["pool_bytes"], o["staging_pages"], o["timeout_s"], o["retry_s"],
                o["control_deadline_ms"], o["lookup_deadline_ms"], o["probe_interval_ms"],
                o["mode"]) == (32 << 20, 4, 2.5, 0.0, 1500, 20, 250, "sidecar")
        assert (b.mode, b.staging_pages, b.timeout) == ("sidecar", 4, 2.5)
    finally:
        b.close()


def test_page_hashes():
    ks = keys(5)
    h = oisgl.page_hashes(ks)
    assert len(h) == 5 * 16
    for i, k in enumerate(ks):
        assert h[16 * i:16 * i + 16] == oi.block_key(bytes.fromhex(k))
    odd = ["not-hex", ks[0].upper(), "x" * 64]
    h2 = oisgl.page_hashes(odd)
    assert h2[16:32] == h[:16]        # hex digits in either case
    assert len(set(h2[i:i + 16] for i in range(0, 48, 16))) == 3
    assert oisgl.page_hashes([]) == b""
    # 64 characters that are not all hex digits (fromhex would skip the space)
    spaced = "ab" * 31 + " a"
    h3 = oisgl.page_hashes(ks[:1] + [spaced])
    assert h3[:16] == h[:16]
    assert h3[16:] == oi.block_key(b"\x00" + hashlib.sha256(spaced.encode()).digest())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_v1_round_trip(layout):
    src = host_pool(layout)
    fill_random(src, seed=3)
    ks = keys(6, seed=7)
    want = [page_bytes(src, p) for p in range(1, 7)]
    b = make(src)
    try:
        # layer_first describes 2 * LAYERS arenas; the page-first layouts 2
        assert len(b.geom.arenas) == (8 if layout == "layer_first" else 2)
        assert b.batch_set_v1(ks, indices(range(1, 7))) == [True] * 6
        src.kv_buffer.zero_()
        assert b.batch_get_v1(ks, indices(range(9, 15))) == [True] * 6
        for i, p in enumerate(range(9, 15)):
            assert page_bytes(src, p) == want[i], "page %d" % i
        for p in list(range(0, 9)) + [15]:  # nothing else was written
            assert not any(page_bytes(src, p))
    finally:
        b.close()


def test_storage_metrics_reach_sglangs_collector():
    """get_stats hands SGLang a StorageMetrics (the type its collector logs
    with --enable-storage-metrics) of the pages each batch moved and its
    GB/s, emptied at each call."""
    from sglang.srt.observability.metrics_collector import StorageMetrics
    src = host_pool("page_first")
    fill_random(src, seed=5)
    ks = keys(6, seed=11)
    b = make(src)
    try:
        assert b.batch_set_v1(ks[:4], indices(range(1, 5))) == [True] * 4
        assert b.batch_set_v1(ks[4:], indices(range(5, 7))) == [True] * 2
        assert b.batch_get_v1(ks, indices(range(9, 15))) == [True] * 6
        assert b.batch_get_v1(keys(2, seed=99), indices(range(1, 3))) == [False] * 2  # a miss
        m = b.get_stats()
        assert isinstance(m, StorageMetrics)
        assert m.backup_pgs == [4, 2] and m.prefetch_pgs == [6]
        assert len(m.backup_bandwidth) == 2 and len(m.prefetch_bandwidth) == 1
        assert all(v > 0 for v in m.backup_bandwidth + m.prefetch_bandwidth)
        again = b.get_stats()
        assert again.backup_pgs == [] and again.prefetch_pgs == []
    finally:
        b.close()


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "layer_first"])
def test_mla_round_trip(layout):
    """SGLang's MLA host pool: one arena (page-first layouts) or one per
    layer; the namespace has no TP rank (every rank holds the same KV)."""
    pool = mla_host_pool(layout)
    fill_random(pool, seed=53)
    ks = keys(4, seed=59)
    want = [page_bytes(pool, p) for p in range(4)]
    b = make(pool, mla=True, tp_rank=0, tp_size=1)
    try:
        assert len(b.geom.arenas) == (4 if layout == "layer_first" else 1)
        assert "/mla-d80-L4-p16-bfloat16-" + layout in b.namespace
        assert "tp" not in b.namespace.split("/")[-1]
        assert b.batch_set_v1(ks, indices(range(4))) == [True] * 4
        assert b.batch_get_v1(ks, indices(range(8, 12))) == [True] * 4
        assert [page_bytes(pool, p) for p in range(8, 12)] == want
        out = b.get(ks[2], pool.get_dummy_flat_data_page())
        assert bytes(out.view(torch.uint8).numpy()) == want[2]
    finally:
        b.close()


def test_mla_embedded_with_tp_is_refused():
    pool = mla_host_pool()
    config = storage_config({}, mla=True, tp_rank=1, tp_size=2)
    b = StorageBackendFactory.create_backend("dynamic", config, pool)
    with pytest.raises(ValueError, match="sidecar"):
        b.register_mem_pool_host(pool)
    b.close()


def test_exists_with_a_prefix_partly_present():
    pool = host_pool()
    fill_random(pool, seed=5)
    ks = keys(8, seed=9)
    b = make(pool)
    try:
        assert b.batch_set_v1(ks[:4], indices(range(4))) == [True] * 4
        assert b.batch_set_v1(ks[5:6], indices([5])) == [True]
        assert b.batch_exists(ks) == 4
        assert b.batch_exists(ks[5:]) == 1
        assert b.batch_exists(ks[4:]) == 0
        assert b.batch_exists([]) == 0
        assert b.exists(ks[5]) and b.exists(ks[0])
        assert not b.exists(ks[4])
        # a get of the whole run loads the present prefix only
        want = [page_bytes(pool, p) for p in range(4)]
        assert b.batch_get_v1(ks, indices(range(8, 16))) == [True] * 4 + [False] * 4
        assert [page_bytes(pool, p) for p in range(8, 12)] == want
    finally:
        b.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_copying_calls(layout):
    """get/set/batch_get/batch_set through the staging block, and their pages
    are the same bytes as the zero-copy calls' (the flat data page is the
    block's arenas in order)."""
    pool = host_pool(layout)
    fill_random(pool, seed=11)
    ks = keys(6, seed=13)
    b = make(pool, {"staging_pages": 2})
    try:
        assert b.set(ks[0], pool.get_data_page(0, flat=True))
        out = b.get(ks[0], pool.get_dummy_flat_data_page())
        assert out is not None and out.dtype == pool.dtype
        assert bytes(out.view(torch.uint8).numpy()) == page_bytes(pool, 0)
        # no target: a new flat tensor of the pool's dtype
        fresh = b.get(ks[0])
        assert bytes(fresh.view(torch.uint8).numpy()) == page_bytes(pool, 0)
        assert b.get(ks[5], pool.get_dummy_flat_data_page()) is None

        # batch_set (5 pages through 2 staging pages) then zero-copy get
        vals = [pool.get_data_page(p * PAGE, flat=True) for p in range(1, 6)]
        want = [page_bytes(pool, p) for p in range(1, 6)]
        assert b.batch_set(ks[1:6], vals) is True
        assert b.batch_get_v1(ks[1:6], indices(range(10, 15))) == [True] * 5
        assert [page_bytes(pool, p) for p in range(10, 15)] == want

        # zero-copy set then batch_get (a miss in the middle ends the run)
        got = b.batch_get(ks[1:6] + keys(1, seed=99) + ks[1:2],
                          [pool.get_dummy_flat_data_page() for _ in range(7)])
        assert [bytes(t.view(torch.uint8).numpy()) for t in got[:5]] == want
        assert got[5:] == [None, None]
        # a value of the wrong size is refused
        assert b.set(keys(1, seed=50)[0], torch.zeros(3, dtype=pool.dtype)) is False
    finally:
        b.close()


def test_pool_full_reports_false():
    """A host tier full of leased blocks drops new saves: the calls answer
    False, nothing raises."""
    pool = host_pool()
    fill_random(pool, seed=17)
    b = make(pool, {"pool_bytes": 4 << 20})   # 128 pages of 32 KiB, at most
    try:
        held = []
        stored = 0
        for r in range(12):
            ks = keys(16, seed=100 + r)
            ok = b.batch_set_v1(ks, indices(range(16)))
            stored += sum(ok)
            q = b.engine.query(oisgl.page_hashes([k for k, o in zip(ks, ok) if o]))
            if q.lease is not None:
                held.append(q)   # the lease pins them: nothing can be evicted
            if not all(ok):
                break
        else:
            pytest.fail("a 4 MiB tier took %d pages of 32 KiB" % stored)
        assert 0 < stored <= 128
        ks = keys(4, seed=500)
        assert b.batch_set_v1(ks, indices(range(4))) == [False] * 4
        assert b.batch_set(ks, [pool.get_data_page(0) for _ in ks]) is False
        assert b.batch_exists(ks) == 0
        assert b.batch_get_v1(ks, indices(range(4))) == [False] * 4
        for q in held:
            q.lease.release()
        # released, the old blocks can be evicted again: saves succeed
        assert b.batch_set_v1(ks, indices(range(4))) == [True] * 4
    finally:
        b.close()


def test_unsupported_layout_is_refused():
    pool = host_pool()
    pool.layout = "page_first_kv_split"
    config = storage_config({})
    b = StorageBackendFactory.create_backend("dynamic", config, pool)
    with pytest.raises(ValueError, match="layout 'page_first_kv_split' is not supported"):
        b.register_mem_pool_host(pool)
    b.close()


def test_calls_before_registration_fail_softly():
    b = StorageBackendFactory.create_backend("dynamic", storage_config({}), None)
    ks = keys(2)
    assert b.batch_exists(ks) == 0
    assert b.exists(ks[0]) is False
    assert b.batch_get_v1(ks, indices([0, 1])) == [False, False]
    assert b.batch_set_v1(ks, indices([0, 1])) == [False, False]
    assert b.get(ks[0]) is None
    assert b.set(ks[0], torch.zeros(4)) is False
    b.close()


def test_ranks_and_models_do_not_share_pages():
    pool = host_pool()
    fill_random(pool, seed=19)
    a = make(pool, tp_rank=0, tp_size=2)
    b = make(pool, tp_rank=1, tp_size=2)
    try:
        assert a.namespace != b.namespace
    finally:
        a.close()
        b.close()
    # the namespace option replaces the model part only: ranks stay apart
    a = make(pool, {"namespace": "tenant-a/m"}, tp_rank=0, tp_size=2)
    b = make(pool, {"namespace": "tenant-a/m"}, tp_rank=1, tp_size=2)
    try:
        assert a.namespace.startswith("tenant-a/m/mha-") and a.namespace.endswith("tp0-2")
        assert b.namespace.endswith("tp1-2")
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- sidecar


def test_model_names_that_read_alike_do_not_share_pages(serve):
    """acme/llama-3-8b and acme-llama/3-8b: different namespaces, and pages
    saved under one are not found under the other through a shared server;
    a second instance of the same model finds them."""
    src, dst, dst2 = host_pool(), host_pool(), host_pool()
    fill_random(src, seed=41)
    ks = keys(5, seed=43)
    want = [page_bytes(src, p) for p in range(0, 5)]
    extra = {"mode": "sidecar", "socket": serve.socket, "staging_pages": 2, "timeout_s": 10}
    a = make(src, extra, model="acme/llama-3-8b")
    b = make(dst, extra, model="acme-llama/3-8b")
    c = make(dst2, extra, model="acme/llama-3-8b")
    try:
        assert a.namespace != b.namespace and a.namespace == c.namespace
        assert a.batch_set_v1(ks, indices(range(0, 5))) == [True] * 5
        assert b.batch_exists(ks) == 0 and not b.exists(ks[0])
        assert b.batch_get_v1(ks, indices(range(8, 13))) == [False] * 5
        assert [any(page_bytes(dst, p)) for p in range(0, PAGES)] == [False] * PAGES
        assert c.batch_exists(ks) == 5
        assert c.batch_get_v1(ks, indices(range(8, 13))) == [True] * 5
        assert [page_bytes(dst2, p) for p in range(8, 13)] == want
    finally:
        a.close()
        b.close()
        c.close()


def published(model, **args):
    """Publishes a real sglang ServerArgs for the tiny model (SGLang's own
    runtime context, as its server does at start) with ARGS."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs
    runtime_context.publish(ServerArgs(model_path=model, device="cpu", **args),
                            role="scheduler")


TINY_MODEL = str(pathlib.Path(__file__).resolve().parent.parent / "tiny-model")


@pytest.mark.parametrize("change", [{"revision": "r2"},
                                    {"json_model_override_args": '{"rope_theta": 5000}'},
                                    {"quantization": "fp8"}],
                         ids=["revision", "override", "quantization"])
def test_a_model_identity_change_shares_no_pages(serve, change):
    """SGLang's published server arguments are in the namespace: pages saved
    at revision r1 through a shared server are found by a second instance of
    the same arguments, and by none whose revision, config override or
    quantization differs (0 of 5 hits, its pages untouched)."""
    from sglang.srt import runtime_context
    src, same, other = host_pool(), host_pool(), host_pool()
    fill_random(src, seed=71)
    ks = keys(5, seed=73)
    want = [page_bytes(src, p) for p in range(0, 5)]
    extra = {"mode": "sidecar", "socket": serve.socket, "staging_pages": 2, "timeout_s": 10}
    made = []
    try:
        published(TINY_MODEL, revision="r1")
        a = make(src, extra, model=TINY_MODEL)
        made.append(a)
        c = make(same, extra, model=TINY_MODEL)
        made.append(c)
        published(TINY_MODEL, **dict({"revision": "r1"}, **change))
        b = make(other, extra, model=TINY_MODEL)
        made.append(b)
        assert a.namespace == c.namespace and a.namespace != b.namespace
        assert a.batch_set_v1(ks, indices(range(0, 5))) == [True] * 5
        assert b.batch_exists(ks) == 0
        assert b.batch_get_v1(ks, indices(range(8, 13))) == [False] * 5
        assert [any(page_bytes(other, p)) for p in range(0, PAGES)] == [False] * PAGES
        assert c.batch_exists(ks) == 5
        assert c.batch_get_v1(ks, indices(range(8, 13))) == [True] * 5
        assert [page_bytes(same, p) for p in range(8, 13)] == want
    finally:
        for x in made:
            x.close()
        runtime_context.reset_context()


def sidecar(pool, serve, **extra):
    return make(pool, dict({"mode": "sidecar", "socket": serve.socket, "staging_pages": 2,
                            "retry_s": 0.1, "timeout_s": 10}, **extra))


def wait_for(fn, secs=15):
    deadline = time.time() + secs
    while time.time() < deadline:
        if fn():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_sidecar_round_trip_between_two_instances(serve, layout):
    """Two SGLang instances (two host pools, one model and rank) share pages
    through one server; 5 pages go through 2 staging pages."""
    src, dst = host_pool(layout), host_pool(layout)
    fill_random(src, seed=23)
    ks = keys(5, seed=29)
    want = [page_bytes(src, p) for p in range(2, 7)]
    a, b = sidecar(src, serve), sidecar(dst, serve)
    try:
        assert a.namespace == b.namespace
        assert a.batch_set_v1(ks, indices(range(2, 7))) == [True] * 5
        assert b.batch_exists(ks) == 5
        assert b.batch_get_v1(ks, indices(range(8, 13))) == [True] * 5
        assert [page_bytes(dst, p) for p in range(8, 13)] == want
        assert [any(page_bytes(dst, p)) for p in range(0, 8)] == [False] * 8
        # the copying calls over the sidecar
        out = b.get(ks[3], dst.get_dummy_flat_data_page())
        assert bytes(out.view(torch.uint8).numpy()) == want[3]
        extra = keys(3, seed=31)
        assert b.batch_set(extra, [dst.get_data_page(p * PAGE) for p in (8, 9, 10)])
        assert a.batch_exists(extra) == 3
    finally:
        a.close()
        b.close()


def test_sidecar_gone_misses_then_recovers(serve):
    pool = host_pool()
    fill_random(pool, seed=37)
    ks = keys(4, seed=41)
    b = sidecar(pool, serve)
    try:
        assert b.batch_set_v1(ks[:2], indices(range(2))) == [True, True]
        serve.stop()     # SIGKILL: the server is gone
        assert b.batch_exists(ks) == 0
        assert b.exists(ks[0]) is False
        assert b.batch_get_v1(ks[:2], indices([8, 9])) == [False, False]
        assert b.batch_set_v1(ks[2:], indices([2, 3])) == [False, False]
        assert b.get(ks[0], pool.get_dummy_flat_data_page()) is None
        assert b.set(ks[3], pool.get_data_page(0)) is False
        serve.start()    # a new server on the same socket: the engine reconnects
        want = page_bytes(pool, 2)
        assert wait_for(lambda: b.batch_set_v1(ks[2:3], indices([2])) == [True])
        assert b.batch_exists(ks[2:3]) == 1
        assert b.batch_get_v1(ks[2:3], indices([12])) == [True]
        assert page_bytes(pool, 12) == want
    finally:
        b.close()


def test_sidecar_absent_at_start(serve):
    """No server when the pool is registered: the backend still attaches,
    misses, and connects once a server listens."""
    pool = host_pool()
    fill_random(pool, seed=43)
    serve.stop()
    ks = keys(2, seed=47)
    b = sidecar(pool, serve)
    try:
        assert b.staged is None
        assert b.batch_exists(ks) == 0
        assert b.batch_set_v1(ks, indices([0, 1])) == [False, False]
        serve.start()
        assert wait_for(lambda: b.batch_set_v1(ks, indices([0, 1])) == [True, True])
        assert b.batch_exists(ks) == 2
    finally:
        b.close()


def test_sidecar_hung_times_out_then_recovers(serve):
    """A server that stops answering (SIGSTOP): the save reports False within
    about timeout_s, the backend drops its engine and staging buffer, and
    works again once the server runs (SIGCONT)."""
    import signal
    pool = host_pool()
    fill_random(pool, seed=61)
    ks = keys(3, seed=67)
    b = sidecar(pool, serve, timeout_s=0.5, control_deadline_ms=1000)
    try:
        assert b.batch_set_v1(ks[:1], indices([0])) == [True]
        serve.pause()
        try:
            t0 = time.time()
            assert b.batch_set_v1(ks[1:2], indices([1])) == [False]
            before = page_bytes(pool, 9)
            assert b.batch_get_v1(ks[:1], indices([9])) == [False]
            assert time.time() - t0 < 10
        finally:
            serve.proc.send_signal(signal.SIGCONT)
        # SGLang owns page 9 again once the get said False: the server, which
        # finishes the stopped load after SIGCONT, never writes into it
        time.sleep(1.0)
        assert page_bytes(pool, 9) == before
        want = page_bytes(pool, 2)
        assert wait_for(lambda: b.batch_set_v1(ks[2:3], indices([2])) == [True])
        assert b.batch_get_v1(ks[2:3], indices([12])) == [True]
        assert page_bytes(pool, 12) == want
    finally:
        b.close()


# ------------------------------------------------- SGLang's own controller code


def controller(backend, pool, v1):
    """SGLang's HiCacheController storage methods (the installed version's
    code: write-back, hit query, prefetch transfer) bound to a stand-in that
    holds only what they read: the backend, the host pool, the page size."""
    import queue
    import types
    from sglang.srt.managers.cache_controller import HiCacheController
    c = types.SimpleNamespace(storage_backend=backend, storage_host_pool=pool,
                              mem_pool_host=pool, page_size=pool.page_size,
                              prefetch_sync_queue=queue.Queue())
    for name in ("_page_backup", "_storage_hit_query", "_page_transfer",
                 "_page_transfer_kv_batch", "_page_get_zero_copy", "_page_set_zero_copy",
                 "_generic_page_get", "_generic_page_set"):
        setattr(c, name, types.MethodType(getattr(HiCacheController, name), c))
    c.page_get_func = c._page_get_zero_copy if v1 else c._generic_page_get
    c.page_set_func = c._page_set_zero_copy if v1 else c._generic_page_set
    return c


@pytest.mark.parametrize("v1", [True, False], ids=["interface_v1", "generic"])
def test_sglang_controller_backup_query_prefetch(v1):
    """Pages written back by SGLang's _page_backup under SGLang's own page
    keys are found by its _storage_hit_query and brought back by its
    _page_transfer, byte-exact."""
    from sglang.srt.managers.cache_controller import PrefetchOperation, StorageOperation
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    pool = host_pool()
    fill_random(pool, seed=71)
    b = make(pool, {"interface_v1": int(v1), "staging_pages": 2})
    try:
        c = controller(b, pool, v1)
        tokens = list(range(1000, 1000 + 5 * PAGE))
        ks = get_storage_hash_str(tokens, None, page_size=PAGE)
        assert len(ks) == 5 and all(len(k) == 64 for k in ks)
        want = [page_bytes(pool, p) for p in range(5)]
        op = StorageOperation(indices(range(5)), tokens, hash_value=ks)
        c._page_backup(op)
        assert op.completed_tokens == 5 * PAGE

        # a request whose prompt goes 2 pages past what was written back
        pf = PrefetchOperation("req-1", tokens + list(range(7, 7 + 2 * PAGE)))
        hash_value, hit_tokens = c._storage_hit_query(pf)
        assert hash_value == ks and hit_tokens == 5 * PAGE
        pf.hash_value = hash_value
        pf.host_indices = indices(range(8, 13))
        assert c._page_transfer(pf) == 5
        assert [page_bytes(pool, p) for p in range(8, 13)] == want
        acks = [c.prefetch_sync_queue.get_nowait() for _ in range(c.prefetch_sync_queue.qsize())]
        assert sum(a.completed_tokens for a in acks) == 5 * PAGE
    finally:
        b.close()


# ----------------------------------------------------------------------------- TP > 1


def test_mha_tp2_each_rank_round_trips_its_own_shard(serve):
    """MHA at TP = 2 through one sidecar: instance A's two ranks (their own
    host pools, their own bytes: each rank's heads) save the same page keys;
    instance B's rank r loads exactly A's rank r bytes. A page rank 1 of A
    did not save is missing for rank 1 only: its batch_exists is shorter,
    and SGLang's controller takes the MIN over the ranks (its
    _sync_prefetch_hit_query), so the shorter prefix is what every rank loads."""
    ks = keys(5, seed=41)
    made = []
    try:
        a = []
        for r in range(2):
            pool = host_pool()
            fill_random(pool, seed=100 + r)
            be = make(pool, {"mode": "sidecar", "socket": serve.socket, "staging_pages": 2},
                      tp_rank=r, tp_size=2)
            made.append(be)
            a.append((pool, be))
        assert a[0][1].namespace != a[1][1].namespace
        assert a[0][1].namespace.endswith("/tp0-2") and a[1][1].namespace.endswith("/tp1-2")
        want = [[page_bytes(pool, p) for p in range(2, 7)] for pool, _ in a]
        assert want[0] != want[1]
        assert a[0][1].batch_set_v1(ks, indices(range(2, 7))) == [True] * 5
        assert a[1][1].batch_set_v1(ks[:3], indices(range(2, 5))) == [True] * 3  # 3 of 5
        b = []
        for r in range(2):
            pool = host_pool()
            be = make(pool, {"mode": "sidecar", "socket": serve.socket, "staging_pages": 2},
                      tp_rank=r, tp_size=2)
            made.append(be)
            b.append((pool, be))
        hits = [be.batch_exists(ks) for _, be in b]
        assert hits == [5, 3]
        common = min(hits)  # SGLang's all-reduce MIN over the TP group
        for r, (pool, be) in enumerate(b):
            assert be.batch_get_v1(ks[:common], indices(range(8, 8 + common))) == \
                [True] * common
            assert [page_bytes(pool, p) for p in range(8, 8 + common)] == want[r][:common]
    finally:
        for x in made:
            x.close()


def test_mla_tp2_the_latent_is_written_once_and_read_by_every_rank(serve):
    """MLA at TP = 2 through one sidecar: both ranks of an instance share one
    namespace (every rank holds the same latent); SGLang makes only rank 0
    the storage writer (HiCacheStorageConfig.is_storage_writer), and rank 0's
    one copy is what rank 0 and rank 1 of another instance load, byte for
    byte. The server holds the pages once."""
    from conftest import storage_config as sc
    assert sc({}, tp_rank=0, tp_size=2, mla=True).is_storage_writer
    assert not sc({}, tp_rank=1, tp_size=2, mla=True).is_storage_writer
    ks = keys(4, seed=43)
    made = []
    try:
        src = mla_host_pool()
        fill_random(src, seed=47)
        w = make(src, {"mode": "sidecar", "socket": serve.socket, "staging_pages": 2},
                 tp_rank=0, tp_size=2, mla=True)
        made.append(w)
        want = [page_bytes(src, p) for p in range(1, 5)]
        assert w.batch_set_v1(ks, indices(range(1, 5))) == [True] * 4
        readers = []
        for r in range(2):
            pool = mla_host_pool()
            be = make(pool, {"mode": "sidecar", "socket": serve.socket, "staging_pages": 2},
                      tp_rank=r, tp_size=2, mla=True)
            made.append(be)
            readers.append((pool, be))
            assert be.namespace == w.namespace
        for pool, be in readers:
            assert be.batch_exists(ks) == 4
            assert be.batch_get_v1(ks, indices(range(9, 13))) == [True] * 4
            assert [page_bytes(pool, p) for p in range(9, 13)] == want
        # one copy in the tier: the server's pages of this namespace
        st = w.stats()
        assert st["namespace_blocks_resident"] == 4, st
    finally:
        for x in made:
            x.close()


# ---------------------------------------------------------------- pipeline and data parallel


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("mode", ["embedded", "sidecar"])
def test_pp2_each_stage_round_trips_its_own_layers(mode, kind, request):
    """PP = 2: each stage's host pool holds only its layers (SGLang's
    start_layer / end_layer: layers 0-1 and 2-3) and its namespace carries
    the PP rank, so one page key is a page of its own per stage. Stage 1
    saves 3 of the 5 pages stage 0 saves: its batch_exists is shorter, and
    SGLang's controller takes the MIN over the TP and PP groups
    (_sync_prefetch_hit_query), so the common prefix is what both stages
    load, each its own layers' bytes. Sidecar: into the stages of another
    instance; embedded: each stage's pool is its own process's, so a stage
    loads its pages back into other pages of its own pool."""
    pool_of = host_pool if kind == "mha" else mla_host_pool
    extra = {"mode": mode, "staging_pages": 2}
    if mode == "sidecar":
        extra["socket"] = request.getfixturevalue("serve").socket
    ks = keys(5, seed=53)
    stages = [(0, 2), (2, 4)]
    made = []
    try:
        a = []
        for p, layers in enumerate(stages):
            pool = pool_of(layers=layers)
            fill_random(pool, seed=200 + p)
            be = make(pool, extra, pp_rank=p, pp_size=2, mla=kind == "mla")
            made.append(be)
            a.append((pool, be))
        assert [pool.layer_num for pool, _ in a] == [2, 2]
        assert a[0][1].namespace.endswith("/pp0-2") and a[1][1].namespace.endswith("/pp1-2")
        assert "-L2-" in a[0][1].namespace and a[0][1].namespace != a[1][1].namespace
        want = [[page_bytes(pool, p) for p in range(2, 7)] for pool, _ in a]
        assert want[0] != want[1]
        assert a[0][1].batch_set_v1(ks, indices(range(2, 7))) == [True] * 5
        assert a[1][1].batch_set_v1(ks[:3], indices(range(2, 5))) == [True] * 3  # 3 of 5
        if mode == "sidecar":
            b = []
            for p, layers in enumerate(stages):
                pool = pool_of(layers=layers)
                be = make(pool, extra, pp_rank=p, pp_size=2, mla=kind == "mla")
                made.append(be)
                b.append((pool, be))
        else:
            b = a
        hits = [be.batch_exists(ks) for _, be in b]
        assert hits == [5, 3]
        common = min(hits)  # SGLang's all-reduce MIN over the PP group
        for p, (pool, be) in enumerate(b):
            assert be.batch_get_v1(ks[:common], indices(range(9, 9 + common))) == \
                [True] * common
            assert [page_bytes(pool, q) for q in range(9, 9 + common)] == want[p][:common]
    finally:
        for x in made:
            x.close()


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_dp_ranks_share_pages_through_the_sidecar(serve, kind):
    """DP attention: SGLang's storage config of each DP rank carries its
    attention TP rank and size and dp_rank (_generate_storage_config). The
    DP ranks compute the same KV for the same tokens, so they share one
    namespace (the DP rank is not in it): a page DP rank 0 saved is found
    by DP rank 1 and loads byte-equal into its pool. MLA: each DP rank's
    attention TP rank 0 is a storage writer; the second write of the same
    pages stores nothing more (one copy in the tier)."""
    pool_of = host_pool if kind == "mha" else mla_host_pool
    mla = kind == "mla"
    extra = {"mode": "sidecar", "socket": serve.socket, "staging_pages": 2}
    ks = keys(4, seed=59)
    made = []
    try:
        src = pool_of()
        fill_random(src, seed=61)
        d0 = make(src, extra, dp_rank=0, mla=mla)
        made.append(d0)
        dst = pool_of()
        d1 = make(dst, extra, dp_rank=1, mla=mla)
        made.append(d1)
        assert d0.storage_config.dp_rank == 0 and d1.storage_config.dp_rank == 1
        assert d0.namespace == d1.namespace
        if mla:
            assert d0.storage_config.is_storage_writer and d1.storage_config.is_storage_writer
        want = [page_bytes(src, p) for p in range(1, 5)]
        assert d0.batch_set_v1(ks, indices(range(1, 5))) == [True] * 4
        assert d1.batch_exists(ks) == 4
        assert d1.batch_get_v1(ks, indices(range(6, 10))) == [True] * 4
        assert [page_bytes(dst, p) for p in range(6, 10)] == want
        # DP rank 1 writes the same pages (its own computation of them): held once
        assert d1.batch_set_v1(ks, indices(range(6, 10))) == [True] * 4
        st = d1.stats()
        assert st["namespace_blocks_resident"] == 4, st
    finally:
        for x in made:
            x.close()


# ----------------------------------------------------------------------------- codecs

CORPUS = pathlib.Path(__file__).resolve().parents[4] / "tests" / "data" / "kvcorpus" / "kv.bin"


def fill_corpus(pool, skew):
    """The pool filled with real KV values of the corpus (bf16, tiled);
    skew: every run of DIM values (one token's K or V of one head and layer,
    in every layout) scaled by its own power of two, by its index mod 3
    (exact), so that a scale taken over the wrong elements breaks the bound."""
    corpus = torch.frombuffer(bytearray(CORPUS.read_bytes()), dtype=torch.bfloat16)
    flat = pool.kv_buffer.view(-1)
    n = flat.numel()
    # from a third in (layers 10 on: the corpus is layer by layer, and the
    # first layers' KV compresses least)
    corpus = torch.cat([corpus[corpus.numel() // 3:], corpus[:corpus.numel() // 3]])
    vals = corpus.repeat(n // corpus.numel() + 1)[:n].float().view(-1, DIM)
    if skew:
        vals = vals * (2.0 ** (4 * (torch.arange(vals.shape[0]) % 3))).view(-1, 1)
    flat.copy_(vals.view(-1).to(torch.bfloat16))


def int8_within_bound(got, want):
    """Pages' bytes: every run of DIM bf16 values (one token's K or V of one
    head and layer) within half its scale step (amax / 127), plus the bf16
    rounding of the decoded value."""
    g = torch.frombuffer(bytearray(got), dtype=torch.bfloat16).float().view(-1, DIM)
    w = torch.frombuffer(bytearray(want), dtype=torch.bfloat16).float().view(-1, DIM)
    step = w.abs().amax(dim=1, keepdim=True) / 127
    return bool(((g - w).abs() <= step / 2 + w.abs() / 128 + 1e-30).all())


def int8_hadamard_within_bound(got, want):
    """int8-hadamard: every run of DIM values within its bound in L2: the
    codes are within half a step (amax |y| / 127) of y = H x / 2^k (H the
    Sylvester Hadamard matrix of order DIM, k = floor(log2(DIM) / 2)), which
    the decoder's H / 2^(log2(DIM) - k) takes back at 2^k times their norm;
    plus the bf16 rounding."""
    lg = DIM.bit_length() - 1
    assert 1 << lg == DIM
    H = torch.ones(1, 1, dtype=torch.float64)
    while H.shape[0] < DIM:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    g = torch.frombuffer(bytearray(got), dtype=torch.bfloat16).double().view(-1, DIM)
    w = torch.frombuffer(bytearray(want), dtype=torch.bfloat16).double().view(-1, DIM)
    step = (w @ H.T / 2 ** (lg // 2)).abs().amax(dim=1) / 127
    err = (g - w).norm(dim=1)
    return bool((err <= 2 ** (lg // 2) * step / 2 * 1.001 + g.norm(dim=1) / 256 + 1e-30).all())


CODEC_CASES = [("lossless", l, "embedded") for l in LAYOUTS] + \
    [("int8", l, "embedded") for l in LAYOUTS] + \
    [("lossless", "page_first", "sidecar"), ("int8", "layer_first", "sidecar"),
     ("int8-hadamard", "layer_first", "embedded")]


@pytest.mark.parametrize("codec,layout,mode", CODEC_CASES,
                         ids=["%s-%s-%s" % c for c in CODEC_CASES])
def test_a_codec_round_trips_between_two_instances(codec, layout, mode, request):
    """extra_config codec: pages of real KV go through the codec (the
    zero-copy and the copying calls) -- embedded: into the same instance's
    pool, zeroed in between (an embedded pool is the process's own);
    sidecar: between two instances -- lossless byte-equal, int8 every
    token's K or V of every head and layer within half its scale step; the
    namespace names the codec; the engines' namespace is bound to it (an
    engine without the codec is refused)."""
    src = host_pool(layout)
    dst = src if mode == "embedded" else host_pool(layout)
    fill_corpus(src, skew=codec != "lossless")
    ks = keys(5, seed=41)
    want = [page_bytes(src, p) for p in range(2, 7)]
    extra = {"codec": codec}
    if mode == "sidecar":
        extra.update(mode="sidecar", socket=request.getfixturevalue("serve").socket)
    a = make(src, extra)
    b = a if mode == "embedded" else make(dst, extra)
    try:
        assert a.namespace == b.namespace and a.namespace.endswith("/tp0-1/" + codec)
        if codec != "lossless":
            assert a._codec["codec_shape"][0] == PAGE and a._codec["codec_shape"][2] == DIM
        assert a.batch_set_v1(ks, indices(range(2, 7))) == [True] * 5
        if mode == "embedded":
            src.kv_buffer.zero_()
        assert b.batch_exists(ks) == 5
        assert b.batch_get_v1(ks, indices(range(8, 13))) == [True] * 5
        got = [page_bytes(dst, p) for p in range(8, 13)]
        if codec == "lossless":
            assert got == want
        else:
            within = int8_within_bound if codec == "int8" else int8_hadamard_within_bound
            assert all(within(g, w) for g, w in zip(got, want))
            assert got != want, "the lossy codec changed nothing"
        # the copying calls (through the staging block) too
        out = b.get(ks[3], dst.get_dummy_flat_data_page())
        assert bytes(out.view(torch.uint8).numpy()) == got[3]
        if mode == "embedded":  # the namespace is bound to its codec
            with pytest.raises(oi.InvalidArgumentError, match="codec %s" % codec):
                oi.OffloadEngine(a.host, a.namespace, a.staging.arenas,
                                 buffer=bytearray(a.staging.pages * a.staging.page_bytes))
    finally:
        a.close()
        b.close()


def test_the_namespace_differs_by_codec(serve):
    """Pages saved under lossless are not found under codec none or int8
    (another namespace); the namespace without a codec is unchanged."""
    src = host_pool()
    fill_corpus(src, skew=False)
    ks = keys(3, seed=43)
    names = {}
    a = make(src, {"codec": "lossless", "mode": "sidecar", "socket": serve.socket})
    try:
        names["lossless"] = a.namespace
        assert a.batch_set_v1(ks, indices(range(1, 4))) == [True] * 3
        for other in ("none", "int8"):
            b = make(host_pool(), {"codec": other, "mode": "sidecar", "socket": serve.socket})
            try:
                names[other] = b.namespace
                assert b.batch_exists(ks) == 0
            finally:
                b.close()
    finally:
        a.close()
    assert len(set(names.values())) == 3, names
    assert re.fullmatch(r"sglang/model-[0-9a-f]{16}/mha-h2-d64-L4-p16-bfloat16-page_first/"
                        r"tp0-1", names["none"]), names
    assert names["lossless"].endswith("/tp0-1/lossless")
    # the codec is in the digest too, so a namespace option keeps them apart as well
    assert names["lossless"].split("/")[1] != names["none"].split("/")[1]


def test_a_lossy_codec_is_refused_for_an_mla_or_fp16_pool():
    """int8 and fp8 need bf16 K/V heads: an MLA pool and an fp16 pool are
    refused at register_mem_pool_host naming the option and why; lossless
    refuses the fp16 pool too (it compresses less than the slot needs: every
    save would be dropped) and round-trips an MLA pool byte-equal."""
    from openinfer._config import ConfigError
    for pool, why, codecs, allowed in (
            (mla_host_pool(), "an MLA pool", ("int8", "fp8"), "'none' or 'lossless'"),
            (host_pool(dtype=torch.float16), "float16; the lossy codecs", ("int8", "fp8"),
             "'none'"),
            (host_pool(dtype=torch.float16), "float16; the lossless codec compresses bfloat16",
             ("lossless",), "'none'")):
        for codec in codecs:
            config = storage_config({"pool_bytes": 16 << 20, "codec": codec}, mla=True)
            backend = StorageBackendFactory.create_backend("dynamic", config, pool)
            with pytest.raises(ConfigError) as ei:
                backend.register_mem_pool_host(pool)
            msg = str(ei.value)
            assert ei.value.key == "codec" and "option 'codec' is %r" % codec in msg, msg
            assert why in msg and "allowed here: %s" % allowed in msg, msg
    src = mla_host_pool()
    fill_corpus(src, skew=False)
    ks = keys(4, seed=47)
    want = [page_bytes(src, p) for p in range(1, 5)]
    b = make(src, {"codec": "lossless"}, mla=True)
    try:
        assert b.batch_set_v1(ks, indices(range(1, 5))) == [True] * 4
        src.kv_buffer.zero_()
        assert b.batch_get_v1(ks, indices(range(6, 10))) == [True] * 4
        assert [page_bytes(src, p) for p in range(6, 10)] == want
    finally:
        b.close()
