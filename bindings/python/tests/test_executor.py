"""The executor with the reference model: restores from the host tier give
byte-identical completions; drop order via close()."""
import os
import tempfile

import pytest

import openinfer as oi

PROMPT = [(i * 37 + 11) % 500 for i in range(80)]


def test_executor_codec_namespace():
    """codec= and codec_slot_bytes= reach the executor's engines: a lossless
    namespace restores the cold completion (its blocks stored, not
    recomputed); a codec without offload and a lossy codec on the cpu
    model's fp32 KV are refused by name."""
    with oi.RefModel() as model, oi.OffloadHost(64 << 20) as host:
        with oi.Executor(model, offload="none") as cold:
            want = cold.generate(PROMPT, 8)
            k = cold.kv_layout(0)
        block = k["num_layers"] * 2 * k["segment_stride"]
        with pytest.raises(oi.InvalidArgumentError, match="needs offload"):
            oi.Executor(model, codec="lossless")
        with pytest.raises(oi.InvalidArgumentError, match="quantizes bf16 KV"):
            oi.Executor(model, offload="embedded", host=host, codec="int8")
        with pytest.raises(oi.InvalidArgumentError, match="codec"):
            oi.Executor(model, offload="embedded", host=host, codec=7)
        # the cpu model's fp32 KV barely compresses: a slot of the block and the
        # frame's header and mode byte takes every frame
        with oi.Executor(model, offload="embedded", host=host, namespace="py-codec",
                         codec="lossless", codec_slot_bytes=block + 41) as x:
            assert x.generate(PROMPT, 8) == want
            x.flush(30)
            assert x.evict_gpu_cache() > 0
            rid = x.submit(PROMPT, 8)
            x.run_until_idle()
            r = x.result(rid)
            assert r.tokens == want and r.restored_tokens >= 64, r


def test_executor_embedded_restore_parity():
    with oi.RefModel() as model, oi.OffloadHost(64 << 20) as host:
        with oi.Executor(model, offload="none") as cold:
            want = cold.generate(PROMPT, 8)
        assert len(want) == 8
        seen = []
        x = oi.Executor(model, offload="embedded", host=host, gpu_blocks=64,
                        on_token=lambda rid, tok, i, fin: seen.append((rid, tok, i, fin)))
        with x:
            rid = x.submit(PROMPT, 8)
            x.run_until_idle()
            r = x.result(rid)
            assert r.finished and r.tokens == want and r.restored_tokens == 0
            assert [s[1] for s in seen if s[0] == rid] == want and seen[-1][3]
            assert len(x.request_blocks(rid)) >= len(PROMPT) // 16
            x.flush(30)
            assert x.evict_gpu_cache() > 0
            rid2 = x.submit(PROMPT, 8)
            x.run_until_idle()
            r2 = x.result(rid2)
            assert r2.tokens == want
            assert r2.restored_tokens >= 64, r2
            st = x.stats()
            assert st["restores_completed"] >= 1 and st["requests_finished"] == 2
            assert st["restores_overlapped"] == 0  # the cpu model has no per-layer events
            assert x.kv_layout(0)["page_size"] == 16
            with pytest.raises(oi.InvalidArgumentError):
                x.submit([], 4)
        with pytest.raises(oi.ClosedError):
            x.step()
    # closing the model first closes its executors
    m = oi.RefModel()
    x = oi.Executor(m)
    m.close()
    assert x.closed


def test_executor_sidecar(serve):
    with oi.RefModel() as model:
        with oi.Executor(model) as cold:
            want = cold.generate(PROMPT, 6)
        with oi.Executor(model, offload="sidecar", socket_path=serve) as x:
            assert x.generate(PROMPT, 6) == want
            x.flush(30)
        with oi.Executor(model, offload="sidecar", socket_path=serve) as x:
            rid = x.submit(PROMPT, 6)
            x.run_until_idle()
            r = x.result(rid)
            assert r.tokens == want and r.restored_tokens > 0
