"""Restore or recompute from Python (docs/planner.md): where each queried
block is (the pool, then the disk once the pool evicted it), the host's
read-rate estimates, oi_plan_restore, and an executor that computes a
prompt whose blocks sit on a slow disk (same tokens as cold)."""
import os
import time

import pytest

import openinfer as oi

BLOCK = 16384
N = 8


def test_query_says_where_each_block_is(tmp_path):
    disk_dir = str(tmp_path / "disk")
    os.mkdir(disk_dir, 0o700)
    hs = oi.hash_blocks(list(range(N * 16)), 16)
    with oi.OffloadHost(4 << 20, pin=False, disk_bytes_per_s=123456789) as host:
        st = host.stats()
        assert st["disk_bytes_per_s"] == 123456789 and st["disk_samples"] == 0
        assert st["link_bytes_per_s"] > 0
        host.attach_disk([disk_dir], 32 << 20)
        buf = bytearray(2 * N * BLOCK)
        eng = oi.OffloadEngine(host, "py/where", [oi.Arena("kv", 2 * N, BLOCK)], buffer=buf)
        eng.save(list(range(N // 2)), hs[:N // 2]).wait(10)
        q = eng.query(hs, membership=True)
        assert q.where == ["pool"] * (N // 2) + [None] * (N // 2)
        eng.flush(10)
        deadline = time.monotonic() + 10
        while host.disk_stats()["spills"] < N // 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        host.evict_all()
        q = eng.query(hs, membership=True)
        assert q.where == ["disk"] * (N // 2) + [None] * (N // 2)
        q = eng.query(hs, wait_pending=10)  # promotes them: found on the disk
        assert q.hit_blocks == N // 2 and q.where[:N // 2] == ["disk"] * (N // 2)
        assert q.where[N // 2:] == [None] * (N // 2)
        q.lease.release()
        q = eng.query(hs)  # back in the pool now
        assert q.where[:N // 2] == ["pool"] * (N // 2)
        q.lease.release()
        eng.close()


def test_plan_restore():
    common = dict(prompt_tokens=16 * 64 + 10, n_blocks=64, block_tokens=16,
                  block_bytes=16 * 147456, link_bytes_per_s=25_000_000_000,
                  prefill_ns_per_token=15000, prefill_ns_per_token_ctx=2, split=False)
    p = oi.plan_restore(**common)
    assert p["load_blocks"] == 64 and p["compute_head_blocks"] == 0
    assert p["est_ns"] == p["est_load_all_ns"] < p["est_cold_ns"]
    slow = oi.plan_restore(where=["disk"] * 64, disk_bytes_per_s=50_000_000, staged=True,
                           **common)
    assert slow["load_blocks"] == 0 and slow["est_ns"] == slow["est_cold_ns"]
    assert slow["compute_tokens"] == common["prompt_tokens"]
    common["split"] = True
    both = oi.plan_restore(where=["disk"] * 64, disk_bytes_per_s=5_000_000_000, **common)
    assert both["est_ns"] <= min(both["est_cold_ns"], both["est_load_all_ns"])
    with pytest.raises(oi.InvalidArgumentError, match="disk_bytes_per_s"):
        oi.plan_restore(where=["disk"] * 64, **common)
    with pytest.raises(oi.InvalidArgumentError, match="no such place"):
        oi.plan_restore(where=["tape"] * 64, **common)


PROMPT = [(i * 37 + 11) % 500 for i in range(80)]


def test_executor_computes_what_a_slow_disk_holds(tmp_path):
    disk_dir = str(tmp_path / "disk")
    os.mkdir(disk_dir, 0o700)
    with oi.RefModel() as model, oi.OffloadHost(8 << 20, pin=False) as host:
        host.attach_disk([disk_dir], 64 << 20)
        with oi.Executor(model, offload="embedded", host=host, gpu_blocks=64,
                         disk_bytes_per_s=1000) as x:
            want = x.generate(PROMPT, 8)
            x.flush(30)
            deadline = time.monotonic() + 10
            while (host.disk_stats()["spills"] < host.stats()["blocks_sealed"]
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            host.evict_all()
            x.evict_gpu_cache()
            rid = x.submit(PROMPT, 8)
            x.run_until_idle()
            r = x.result(rid)
            assert r.tokens == want and r.restored_tokens == 0
            st = x.stats()
            assert st["plans"] == 1 and st["plans_compute"] == 1
            # fitted to the forwards: a cost per token, or per position of context
            # alone where the fit's per-token part came out negative (timing noise)
            assert st["prefill_samples"] > 0
            assert st["prefill_ns_per_token"] > 0 or st["prefill_ns_per_token_ctx"] > 0, st
        with pytest.raises(oi.InvalidArgumentError, match="restore_plan"):
            oi.Executor(model, restore_plan="sometimes")
