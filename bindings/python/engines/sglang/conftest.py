"""Fixtures of the SGLang storage tests: real SGLang host KV pools on the CPU
and a real `openinfer serve` that a test may stop and start again."""
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import torch

from sglang.srt.mem_cache.device_pool_info import (KVBufferLayout, KVBuffers, MHABufferInfo,
                                                   MLABufferInfo)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

LAYERS, HEADS, DIM, PAGE = 4, 2, 64, 16   # a page: 2 * 4 * 16 * 2 * 64 * 2 = 32 KiB
PAGES = 16


def host_pool(layout="page_first", pages=PAGES, dtype=torch.bfloat16, layers=(0, LAYERS)):
    """A real MHATokenToKVPoolHost of the installed SGLang, on the CPU;
    layers: the [start, end) of a pipeline stage's layers."""
    tokens = 2 * pages * PAGE
    n = layers[1] - layers[0]
    k = tuple(torch.zeros(tokens, HEADS, DIM, dtype=dtype) for _ in range(n))
    v = tuple(torch.zeros(tokens, HEADS, DIM, dtype=dtype) for _ in range(n))

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                          layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM, dtype=dtype,
        device=torch.device("cpu"))
    pool = MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=layers[0],
                                end_layer=layers[1], host_token_capacity=pages * PAGE)
    pool._device_keepalive = (k, v)
    return pool


def mla_host_pool(layout="page_first", pages=PAGES, rank=64, rope=16, dtype=torch.bfloat16,
                  layers=(0, LAYERS)):
    """A real MLATokenToKVPoolHost of the installed SGLang, on the CPU;
    layers: the [start, end) of a pipeline stage's layers."""
    tokens = 2 * pages * PAGE
    n = layers[1] - layers[0]
    bufs = tuple(torch.zeros(tokens, 1, rank + rope, dtype=dtype) for _ in range(n))
    info = MLABufferInfo(
        buffers=bufs, data_ptrs=torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
        layer_indices=tuple(range(n)), device_layer_num=n, page_size=PAGE,
        kv_lora_rank=rank, qk_rope_head_dim=rope, kv_cache_dim=rank + rope, dtype=dtype,
        device=torch.device("cpu"))
    pool = MLATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=layers[0],
                                end_layer=layers[1], target_layer_num=n,
                                host_token_capacity=pages * PAGE)
    pool._device_keepalive = bufs
    return pool


def storage_config(extra, tp_rank=0, tp_size=1, model="tiny/model", mla=False, pp_rank=0,
                   pp_size=1, dp_rank=0):
    """As SGLang's cache controller makes it (_generate_storage_config):
    with dp attention, tp_rank and tp_size are the attention TP group's and
    dp_rank is the attention DP rank."""
    base = {"backend_name": "openinfer", "module_path": "openinfer.sglang",
            "class_name": "OpenInferStorage", "interface_v1": 1}
    base.update(extra)
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=True, model_name=model, dp_rank=dp_rank, extra_config=base)


def keys(n, seed=0):
    """n SGLang-style page keys (64 hex digits)."""
    return [hashlib.sha256(b"%d/%d" % (seed, i)).hexdigest() for i in range(n)]


def indices(pages):
    """SGLang's host_indices of these pages (token indices, page_size each)."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE, dtype=torch.int64) for p in pages])


def fill_random(pool, seed=1):
    g = torch.Generator().manual_seed(seed)
    data = pool.kv_buffer.view(-1).view(torch.uint8)
    data.copy_(torch.randint(0, 256, data.shape, dtype=torch.uint8, generator=g))


def page_bytes(pool, page):
    return bytes(pool.get_data_page(page * PAGE, flat=True).contiguous().view(torch.uint8).numpy())


class Serve:
    """An `openinfer serve` subprocess on a private socket."""

    def __init__(self, exe, pool="64M"):
        self.exe, self.pool = exe, pool
        self.dir = tempfile.mkdtemp(prefix="oi-sgl-")
        self.socket = os.path.join(self.dir, "oi.sock")
        self.proc = None
        self.log = None

    def start(self):
        self.log = open(os.path.join(self.dir, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [self.exe, "serve", "--socket", self.socket, "--pool", self.pool, "--no-pin",
             "--no-metrics", "--log-level", "info"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while True:
            self.log.seek(0)
            if "listening on" in self.log.read():
                return self
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                raise RuntimeError("openinfer serve did not start:\n" + self.log.read())
            time.sleep(0.01)

    def pause(self):
        """SIGSTOP, returning once every thread of the server is stopped (the
        signal is delivered asynchronously: a thread still on a CPU could
        answer one more request)."""
        self.proc.send_signal(signal.SIGSTOP)
        task = "/proc/%d/task" % self.proc.pid
        deadline = time.time() + 5
        while time.time() < deadline:
            states = []
            for t in os.listdir(task):
                try:
                    with open(os.path.join(task, t, "stat")) as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except OSError:
                    pass
            if states and all(s in ("T", "t") for s in states):
                return
            time.sleep(0.001)
        raise RuntimeError("openinfer serve (pid %d) did not stop within 5 s" % self.proc.pid)

    def stop(self, sig=signal.SIGKILL):
        p, self.proc = self.proc, None
        if p is not None:
            p.send_signal(sig)
            p.wait(30)
        if self.log is not None:
            self.log.close()
            self.log = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def serve():
    exe = os.environ.get("OPENINFER_EXE")
    if not exe or not os.path.exists(exe):
        pytest.fail("OPENINFER_EXE (the openinfer tool) is not set")
    s = Serve(exe).start()
    try:
        yield s
    finally:
        s.close()
