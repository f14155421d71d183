"""openinfer._plan: the connectors' restore plan without an engine."""
import pytest

import openinfer as oi
from openinfer import _config, _plan


def opts(**extra):
    v = _config.parse(_config.VLLM_KEYS, extra, "t")
    return _plan.PlanOptions.pop(v, "t")


def planner(o, calls=None, **kw):
    def rates():
        if calls is not None:
            calls.append(1)
        return {"link_bytes_per_s": 16e9, "disk_bytes_per_s": 2e9, "remote_bytes_per_s": 1e9}
    return _plan.Planner(o, 16, 1 << 20, 36, layerwise=True, rates_fn=rates, **kw)


def test_a_slow_disk_promises_fewer_than_the_pool():
    o = opts(prefill_tokens_per_s=20000)  # 50 us a token; 1 MiB blocks of 16 tokens
    p = planner(o)
    # the pool (65 us a block): all but the few blocks computed under the
    # load's last layers
    n_pool = p.blocks(0, 64 * 16 + 1, 64, ["pool"] * 64)
    assert 60 <= n_pool <= 64
    assert planner(opts(prefill_tokens_per_s=1000)).blocks(0, 64 * 16 + 1, 64, None) == 64
    # 2 GB/s: 524 us a block read, 800 us computed: loading all loses to
    # loading a part under the forward of the rest (layer by layer)
    assert 0 < p.blocks(0, 64 * 16 + 1, 64, ["disk"] * 64) < n_pool
    slow = planner(opts(prefill_tokens_per_s=20000, disk_bytes_per_s=1e8))
    n = slow.blocks(0, 64 * 16 + 1, 64, ["pool"] * 8 + ["disk"] * 56)
    assert 8 <= n < 64
    assert slow.blocks(0, 64 * 16 + 1, 64, ["disk"] * 64) < 64
    assert slow.blocks(0, 64 * 16 + 1, 64, ["disk"] * 64) == slow.last["load_blocks"]
    none = planner(opts(prefill_ns_per_token=10, disk_bytes_per_s=1e6))
    assert none.blocks(0, 64 * 16 + 1, 64, ["disk"] * 64) == 0
    assert none.counts["plans_compute"] == 1


def test_off_promises_every_hit_and_rates_are_cached():
    off = planner(opts(restore_plan="off", prefill_ns_per_token=10, link_bytes_per_s=1))
    assert off.blocks(0, 1000, 10, None) == 10 and off.last is None
    calls = []
    p = planner(opts(plan_rates_refresh_ms=60000), calls)
    for _ in range(5):
        p.blocks(0, 1000, 10, None)
    assert len(calls) == 1  # one estimate taken, reused for 60 s
    assert _plan.Planner(opts(), 16, None).blocks(0, 1000, 10) == 10  # bytes unknown


def test_merge_where_takes_the_slowest_place_per_block():
    assert _plan.merge_where([["pool", "disk", "pool"], ["remote", "pool", None]], 2) == \
        ["remote", "disk"]
    assert _plan.merge_where([None, None], 3) == ["pool"] * 3


def test_options_refused_by_name():
    with pytest.raises(_config.ConfigError) as ei:
        opts(prefill_tokens_per_s=1, prefill_ns_per_token=1)
    assert "'prefill_tokens_per_s'" in str(ei.value) and "both set" in str(ei.value)
    with pytest.raises(_config.ConfigError) as ei:
        opts(disk_bytes_per_s=0)
    assert ei.value.key == "disk_bytes_per_s" and "allowed:" in str(ei.value)
    assert opts().ns_per_token == 1e9 / _config.DEFAULT_PREFILL_TOKENS_PER_S


def test_the_host_estimates_feed_the_plan():
    h = oi.OffloadHost(1 << 20, disk_bytes_per_s=123456789)
    try:
        p = _plan.Planner(opts(), 16, 1 << 20, rates_fn=h.stats)
        assert p.rates()["disk_bytes_per_s"] == 123456789
    finally:
        h.close()
