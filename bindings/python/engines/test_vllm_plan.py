"""The restore plan in openinfer.vllm (docs/planner.md, "The connectors"),
against vLLM's own Scheduler and the worker connector of
test_vllm_connector.py: get_num_new_matched_tokens promises the planned
prefix of the hit blocks, vLLM computes the rest, and what is loaded is
byte-equal to what the stand-in model computed."""
import pytest
import torch

import openinfer as oi

from test_vllm_connector import (BS, LAYERS, LONG_PROMPT, Engine, _distributed,  # noqa: F401
                                 _offline, check_loaded, first_load)

HELD = 40  # full blocks of LONG_PROMPT
BLOCK_BYTES = 2 * 16 * 2 * 2 * BS * LAYERS  # K and V, 2 heads of 16, bfloat16, every layer


def warm_then_ask(extra, load_async=False):
    """Request "a" saves LONG_PROMPT's 40 blocks; vLLM's GPU prefix cache is
    emptied; request "b" (the same blocks, another tail) runs. Returns the
    engine (open), the tokens "b" computed, its load (or None) and the
    scheduler connector's last plan."""
    eng = Engine(dict({"pool_size": "64M"}, **extra), load_async)
    eng.add("a", LONG_PROMPT)
    eng.run()
    assert eng.worker.worker.stats()["saves_completed"] >= HELD
    assert eng.scheduler.reset_prefix_cache()
    for t in eng.kv.values():
        t.zero_()
    prompt = LONG_PROMPT[:HELD * BS] + [7, 8, 9]
    eng.add("b", prompt)
    outs = eng.run()
    # the prompt tokens vLLM computed (the last step decodes the second token)
    computed = sum(so.num_scheduled_tokens.get("b", 0) for so, _ in outs) - 1
    _, meta = first_load(outs)
    ld = check_loaded(eng, "b", meta) if meta is not None else None
    assert not any(kvo and kvo.invalid_block_ids for _, kvo in outs)
    return eng, computed, ld


def expected(link, tokens_per_s, layerwise=True):
    return oi.plan_restore(prompt_tokens=HELD * BS + 3, n_blocks=HELD, block_tokens=BS,
                           block_bytes=BLOCK_BYTES, link_bytes_per_s=round(link),
                           prefill_ns_per_token=1e9 / tokens_per_s, num_layers=LAYERS,
                           layerwise=layerwise, split=False)["load_blocks"]


def test_the_block_bytes_are_the_kv_cache_configs():
    eng = Engine({"pool_size": "64M", "namespace": "t/plan-bytes"})
    try:
        p = eng.scheduler.connector._planner
        assert (p.block_bytes, p.num_layers, p.layerwise) == (BLOCK_BYTES, LAYERS, True)
        assert p.opts.enabled and p.opts.ns_per_token == 1e5  # 10,000 tokens/s
    finally:
        eng.close()


def test_a_fast_pool_promises_every_hit():
    eng, computed, ld = warm_then_ask({"namespace": "t/plan-fast"})
    try:
        assert len(ld.block_ids) == HELD and computed == 3
        assert eng.scheduler.connector._planner.last["load_blocks"] == HELD
    finally:
        eng.close()


def test_a_slow_link_promises_a_prefix_and_vllm_computes_the_rest():
    # 1 M tokens/s: 16 us per block computed; 170 MB/s: 48 us per block
    # loaded; layer by layer, loading about a quarter under the forward of
    # the rest is fastest
    link, tps = 8192 / 48e-6, 1e6
    want = expected(link, tps)
    assert 0 < want < HELD, want
    eng, computed, ld = warm_then_ask({"namespace": "t/plan-slow", "link_bytes_per_s": link,
                                       "prefill_tokens_per_s": tps})
    try:
        assert len(ld.block_ids) == want  # the first `want` blocks, byte-equal (check_loaded)
        assert computed == HELD * BS + 3 - want * BS
        assert eng.worker.worker.stats()["blocks_loaded"] == want
        assert eng.scheduler.connector._planner.counts["plans_partial"] >= 1
    finally:
        eng.close()


@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
def test_computing_everything_is_faster_so_nothing_is_promised(load_async):
    eng, computed, ld = warm_then_ask({"namespace": "t/plan-none-%s" % load_async,
                                       "link_bytes_per_s": 1e6, "prefill_ns_per_token": 1000},
                                      load_async)
    try:
        assert ld is None and computed == HELD * BS + 3
        assert eng.worker.worker.stats()["blocks_loaded"] == 0
        p = eng.scheduler.connector._planner
        assert p.last["load_blocks"] == 0 and p.counts["plans_compute"] >= 1
        assert p.layerwise == (not load_async)
        # the lease was given back: nothing stays pinned
        assert eng.scheduler.connector._host.stats()["leases_active"] == 0
    finally:
        eng.close()


def test_planning_off_promises_every_hit():
    eng, computed, ld = warm_then_ask({"namespace": "t/plan-off", "restore_plan": False,
                                       "link_bytes_per_s": 1e6, "prefill_ns_per_token": 1000})
    try:
        assert len(ld.block_ids) == HELD and computed == 3
        assert eng.scheduler.connector._planner.last is None
    finally:
        eng.close()


def test_both_prefill_rates_are_refused():
    from openinfer._config import ConfigError
    with pytest.raises(ConfigError) as ei:
        Engine({"prefill_tokens_per_s": 5000, "prefill_ns_per_token": 10})
    assert "'prefill_tokens_per_s'" in str(ei.value) and "'prefill_ns_per_token'" in str(ei.value)
    import vllm.distributed.kv_transfer.kv_transfer_state as kts
    from vllm.config import set_current_vllm_config  # noqa: F401
    kts._KV_CONNECTOR_AGENT = None
