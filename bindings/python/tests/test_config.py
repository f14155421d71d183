"""The connectors' option tables (openinfer._config), without an engine: every
bad value is refused with an error that names the key, the value and what is
allowed; every documented spelling parses to its value; the docs' tables list
exactly the keys of the code."""
import os
import re

import pytest

from openinfer import _config as cfg
from openinfer._config import ConfigError

VLLM = "openinfer.vllm: kv_connector_extra_config"
SGLANG = "openinfer.sglang: extra_config"


def vllm(extra):
    return cfg.parse(cfg.VLLM_KEYS, extra, VLLM)


def sglang(extra):
    return cfg.parse(cfg.SGLANG_KEYS, extra, SGLANG, ignore=cfg.SGLANG_OWN_KEYS)


# (options, key, the value as the message shows it, a phrase of what is allowed)
BAD = [
    ({"pool_size": "-1G"}, "pool_size", "'-1G'", "size in bytes greater than 0"),
    ({"pool_size": "lots"}, "pool_size", "'lots'", "size in bytes greater than 0"),
    ({"pool_size": 0}, "pool_size", "is 0;", "size in bytes greater than 0"),
    ({"pool_size": 1.5}, "pool_size", "is 1.5;", "size in bytes greater than 0"),
    ({"pool_size": "1.0000001K"}, "pool_size", "'1.0000001K'", "size in bytes"),
    ({"pool_size": "%d" % (1 << 64)}, "pool_size", str(1 << 64), "size in bytes"),
    ({"lease_ttl_ms": -5}, "lease_ttl_ms", "is -5;", "from 1 to 4294967294"),
    ({"lease_ttl_ms": "abc"}, "lease_ttl_ms", "'abc'", "from 1 to 4294967294"),
    ({"lease_ttl_ms": 0}, "lease_ttl_ms", "is 0;", "from 1 to 4294967294"),
    ({"lease_ttl_ms": 1 << 32}, "lease_ttl_ms", "is 4294967296;", "from 1 to 4294967294"),
    ({"lease_ttl_ms": True}, "lease_ttl_ms", "is True;", "integer"),
    ({"lease_ttl_ms": 1.5}, "lease_ttl_ms", "is 1.5;", "integer"),
    ({"wait_pending_ms": "x"}, "wait_pending_ms", "'x'", "from 0 to 4294967294"),
    ({"wait_pending_ms": -1}, "wait_pending_ms", "is -1;", "from 0 to 4294967294"),
    ({"control_deadline_ms": "10s"}, "control_deadline_ms", "'10s'", "milliseconds"),
    ({"save_deadline_ms": 0}, "save_deadline_ms", "is 0;", "from 1"),
    ({"load_deadline_ms": -1}, "load_deadline_ms", "is -1;", "from 1"),
    ({"lookup_deadline_ms": 0}, "lookup_deadline_ms", "is 0;", "from 1"),
    ({"lookup_deadline_ms": "fast"}, "lookup_deadline_ms", "'fast'", "milliseconds"),
    ({"probe_interval_ms": -100}, "probe_interval_ms", "is -100;", "from 1"),
    ({"load_async": "maybe"}, "load_async", "'maybe'", "true or false"),
    ({"load_async": 1}, "load_async", "is 1;", "true or false"),
    ({"pin": "enabled"}, "pin", "'enabled'", "true or false"),
    ({"namespace": ""}, "namespace", "is '';", "non-empty string of at most 255 bytes"),
    ({"namespace": "n" * 256}, "namespace", "(256 characters)", "at most 255 bytes"),
    ({"namespace": "\u00e9" * 128}, "namespace", "(128 characters)", "at most 255 bytes"),
    ({"namespace": 5}, "namespace", "is 5;", "string"),
    ({"socket": ""}, "socket", "is '';", "non-empty string"),
    ({"mode": "remote"}, "mode", "'remote'", "'embedded', 'sidecar'"),
    ({"copy_mode": "fast"}, "copy_mode", "'fast'", "'auto', 'kernel', 'dma', 'staged'"),
    ({"lookup_retry_s": -1}, "lookup_retry_s", "is -1;", "at least 0"),
    ({"lookup_retry_s": "nan"}, "lookup_retry_s", "'nan'", "at least 0"),
]


@pytest.mark.parametrize("extra,key,shown,allowed", BAD,
                         ids=["%s=%r" % next(iter(b[0].items())) for b in BAD])
def test_vllm_bad_value_is_named(extra, key, shown, allowed):
    with pytest.raises(ConfigError) as ei:
        vllm(extra)
    msg = str(ei.value)
    assert msg.startswith(VLLM + ": option '%s' is " % key), msg
    assert shown in msg and "allowed: " in msg and allowed in msg, msg
    assert ei.value.key == key and ei.value.value == next(iter(extra.values()))
    assert isinstance(ei.value, ValueError)


SGLANG_BAD = [
    ({"pool_bytes": "-1G"}, "pool_bytes", "'-1G'", "size in bytes greater than 0"),
    ({"pool_bytes": 0}, "pool_bytes", "is 0;", "size in bytes greater than 0"),
    ({"staging_pages": 0}, "staging_pages", "is 0;", "from 1 to 1048576"),
    ({"staging_pages": "4.5"}, "staging_pages", "'4.5'", "integer"),
    ({"timeout_s": 0}, "timeout_s", "is 0;", "greater than 0"),
    ({"timeout_s": "soon"}, "timeout_s", "'soon'", "greater than 0"),
    ({"timeout_s": "inf"}, "timeout_s", "'inf'", "at most"),
    ({"retry_s": -0.5}, "retry_s", "is -0.5;", "at least 0"),
    ({"control_deadline_ms": -5}, "control_deadline_ms", "is -5;", "from 1 to 4294967294"),
    ({"lookup_deadline_ms": "x"}, "lookup_deadline_ms", "'x'", "milliseconds"),
    ({"probe_interval_ms": 0}, "probe_interval_ms", "is 0;", "from 1"),
    ({"namespace": ""}, "namespace", "is '';", "non-empty string"),
    ({"mode": "remote"}, "mode", "'remote'", "'embedded', 'sidecar'"),
]


@pytest.mark.parametrize("extra,key,shown,allowed", SGLANG_BAD,
                         ids=["%s=%r" % next(iter(b[0].items())) for b in SGLANG_BAD])
def test_sglang_bad_value_is_named(extra, key, shown, allowed):
    with pytest.raises(ConfigError) as ei:
        sglang(extra)
    msg = str(ei.value)
    assert msg.startswith(SGLANG + ": option '%s' is " % key), msg
    assert shown in msg and allowed in msg, msg
    assert ei.value.key == key


def test_unknown_keys_are_named():
    with pytest.raises(ConfigError) as ei:
        vllm({"pool_sise": "1G", "pool_size": "1G"})
    msg = str(ei.value)
    assert "unknown option 'pool_sise'" in msg and "known: " in msg and "pool_size" in msg
    assert ei.value.key == "pool_sise"
    with pytest.raises(ConfigError, match=r"unknown options 'a', 'b' \(known: "):
        vllm({"b": 1, "a": 2})
    # SGLang: its own keys of the same extra_config pass, a typo does not
    assert sglang({"backend_name": "openinfer", "interface_v1": 1, "tp_lcm_size": 2,
                   "file_storage_path": "/x"})["pool_bytes"] == 1 << 30
    with pytest.raises(ConfigError, match="unknown option 'pool_size'"):
        sglang({"pool_size": "1G"})
    # a vLLM key is not an SGLang key
    with pytest.raises(ConfigError, match="unknown option 'load_async'"):
        sglang({"load_async": True})
    warned = []
    assert cfg.parse(cfg.VLLM_KEYS, {"zz": 1}, VLLM, unknown="warn",
                     warn=warned.append)["pool_size"] == 1 << 30
    assert len(warned) == 1 and "'zz'" in warned[0]
    with pytest.raises(ConfigError, match="must be a mapping"):
        vllm(["pool_size"])


@pytest.mark.parametrize("spelling,value", [
    (True, True), (False, False), ("true", True), ("TRUE", True), ("True", True),
    ("1", True), ("yes", True), ("Yes", True), ("on", True), ("ON", True), (" on ", True),
    ("false", False), ("False", False), ("0", False), ("no", False), ("NO", False),
    ("off", False), ("Off", False)])
def test_boolean_spellings(spelling, value):
    assert vllm({"load_async": spelling})["load_async"] is value
    assert vllm({"pin": spelling})["pin"] is value
    assert cfg.parse_bool(spelling) is value


@pytest.mark.parametrize("spelling,value", [
    (1, 1), (4096, 4096), ("512", 512), ("512B", 512), ("1K", 1024), ("1k", 1024),
    ("512M", 512 << 20), ("512MB", 512 << 20), ("512MiB", 512 << 20), ("4G", 4 << 30),
    (" 4 g ", 4 << 30), ("1.5G", 3 << 29), ("0.5K", 512), ("2T", 2 << 40),
    ((1 << 64) - 1, (1 << 64) - 1)])
def test_size_spellings(spelling, value):
    assert vllm({"pool_size": spelling})["pool_size"] == value
    assert sglang({"pool_bytes": spelling})["pool_bytes"] == value
    assert cfg.parse_size(spelling) == value


def test_good_values_parse_to_their_values():
    o = vllm({"mode": "Sidecar", "socket": "/run/oi.sock", "namespace": "team/m",
              "lease_ttl_ms": "250", "wait_pending_ms": 0, "copy_mode": "DMA",
              "control_deadline_ms": 4294967294, "save_deadline_ms": "+1",
              "load_deadline_ms": " 3000 ", "lookup_retry_s": "0.25",
              "lookup_deadline_ms": "20", "probe_interval_ms": 500, "codec": " Int8 "})
    assert o == dict(mode="sidecar", socket="/run/oi.sock", namespace="team/m",
                     pool_size=1 << 30, pin=None, lease_ttl_ms=250, load_async=False,
                     wait_pending_ms=0, copy_mode=2, codec="int8", control_deadline_ms=4294967294,
                     save_deadline_ms=1, load_deadline_ms=3000, lookup_retry_s=0.25,
                     lookup_deadline_ms=20, probe_interval_ms=500, restore_plan=True,
                     prefill_tokens_per_s=None, prefill_ns_per_token=None,
                     prefill_ns_per_token_ctx=0.0, link_bytes_per_s=None, disk_bytes_per_s=None,
                     remote_bytes_per_s=None, plan_rates_refresh_ms=1000)
    p = vllm({"restore_plan": "off", "prefill_tokens_per_s": "5e4", "disk_bytes_per_s": 1e8,
              "prefill_ns_per_token_ctx": 0.5, "plan_rates_refresh_ms": 10})
    assert (p["restore_plan"], p["prefill_tokens_per_s"], p["disk_bytes_per_s"],
            p["prefill_ns_per_token_ctx"], p["plan_rates_refresh_ms"]) == (False, 5e4, 1e8, 0.5, 10)
    assert [vllm({"copy_mode": m})["copy_mode"] for m in ("auto", "kernel", "dma", "staged")] \
        == [0, 1, 2, 3]
    assert [vllm({"codec": c})["codec"] for c in ("none", "LOSSLESS", "int8", "fp8", "INT8-Hadamard")] \
        == ["none", "lossless", "int8", "fp8", "int8-hadamard"]
    assert [sglang({"codec": c})["codec"] for c in ("none", "Lossless", "int8", "FP8")] \
        == ["none", "lossless", "int8", "fp8"]
    for bad in ("zstd", "", 8, True):
        for parse in (vllm, sglang):
            with pytest.raises(ConfigError, match="option 'codec' is .*allowed: one of 'none', "
                                                  "'lossless', 'int8', 'int8-hadamard', 'fp8'"):
                parse({"codec": bad})
    # a namespace of exactly 255 bytes is allowed
    assert vllm({"namespace": "\u00e9" * 127 + "n"})["namespace"] == "\u00e9" * 127 + "n"


def test_defaults_and_null():
    d = vllm({})
    assert d == vllm({k: None for k in d}), "None (JSON null) must mean the default"
    assert (d["pool_size"], d["load_async"], d["lookup_retry_s"], d["lookup_deadline_ms"],
            d["probe_interval_ms"], d["namespace"], d["wait_pending_ms"], d["codec"]) == \
        (1 << 30, False, 1.0, 50, 100, None, None, "none")
    s = sglang(None)
    assert (s["mode"], s["pool_bytes"], s["staging_pages"], s["timeout_s"], s["retry_s"],
            s["lookup_deadline_ms"], s["probe_interval_ms"], s["codec"]) == \
        ("embedded", 1 << 30, 16, 60.0, 5.0, 50, 100, "none")


def test_parse_helpers_name_what_they_parse():
    with pytest.raises(ConfigError, match="pool 'lots' is not allowed; allowed: a size"):
        cfg.parse_size("lots", "pool")
    with pytest.raises(ConfigError, match="flag 'maybe' is not allowed; allowed: true or false"):
        cfg.parse_bool("maybe", "flag")


def _doc_keys(name):
    """The keys of the options table in docs/NAME.md (the first column of
    the table headed "| key | type |" under "## Options")."""
    src = os.environ.get("OPENINFER_PY_SOURCE",
                         os.path.join(os.path.dirname(__file__), ".."))
    path = os.path.join(src, "..", "..", "docs", name + ".md")
    text = open(path).read()
    section = text[text.index("\n## Options"):]
    table = section[section.index("\n| key | type |"):]
    table = table[:table.index("\n\n")]
    keys = set()
    for line in table.splitlines():
        m = re.match(r"\| `([a-z_]+)` \|", line)
        if m:
            keys.add(m.group(1))
    return keys


@pytest.mark.parametrize("doc,keys", [("vllm", cfg.VLLM_KEYS), ("sglang", cfg.SGLANG_KEYS)])
def test_docs_list_every_key(doc, keys):
    assert _doc_keys(doc) == {k.name for k in keys}
