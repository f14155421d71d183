#!/usr/bin/env python3
"""/metrics, /healthz and `openinfer stats` against a real `openinfer serve`.

    test_metrics.py OPENINFER_EXE OBS_CLIENT_EXE

Starts `openinfer serve --metrics-addr 127.0.0.1:0` on a private socket,
scrapes /metrics over HTTP, parses the Prometheus text format strictly,
runs a client process (oi_engine_connect: save, query, load,
release) and checks that the counters, gauges and histograms moved by what
the client did; checks /healthz, `openinfer stats` (summary and --json),
the logfmt log lines, and a clean stop. Exit 0 pass, 1 fail, 77 skip.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

EXE, CLIENT = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("CHECK failed: " + what, file=sys.stderr)


NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(r"^(" + NAME + r")(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def parse(text):
    """Prometheus text format 0.0.4 -> {(name, ((label, value), ...)): float}."""
    types, samples = {}, {}
    for n, line in enumerate(text.split("\n"), 1):
        if line == "":
            continue
        if line.startswith("#"):
            m = re.match(r"^# (HELP|TYPE) (" + NAME + r") (.+)$", line)
            assert m, "line %d: bad comment: %r" % (n, line)
            if m.group(1) == "TYPE":
                assert m.group(3) in ("counter", "gauge", "histogram", "summary", "untyped"), line
                assert m.group(2) not in types, "line %d: second TYPE for %s" % (n, m.group(2))
                types[m.group(2)] = m.group(3)
            continue
        m = SAMPLE.match(line)
        assert m, "line %d: bad sample: %r" % (n, line)
        name, labels, value = m.group(1), m.group(2), m.group(3)
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        family = family if types.get(family) == "histogram" else name
        assert family in types, "line %d: %s has no TYPE before it" % (n, name)
        if types[family] == "counter":
            assert name.endswith("_total"), "counter %s lacks _total" % name
        pairs = []
        rest = labels or ""
        while rest:
            lm = LABEL.match(rest)
            assert lm, "line %d: bad labels %r" % (n, labels)
            pairs.append((lm.group(1), lm.group(2)))
            rest = rest[lm.end():]
        v = float(value)  # accepts +Inf, NaN
        key = (name, tuple(pairs))
        assert key not in samples, "line %d: duplicate sample %r" % (n, key)
        samples[key] = v
    # Histograms: cumulative buckets ending in +Inf == _count.
    for fam, t in types.items():
        if t != "histogram":
            continue
        buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in samples.items()
                          if k[0] == fam + "_bucket"), key=lambda x: x[0])
        assert buckets and buckets[-1][0] == float("inf"), fam
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), "%s buckets are not cumulative" % fam
        assert counts[-1] == samples[(fam + "_count", ())], fam
    return types, samples


def get(port, path, method="GET"):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def scrape(port):
    status, headers, body = get(port, "/metrics")
    assert status == 200, status
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers["Content-Type"]
    return parse(body)[1]


def val(s, name, **labels):
    return s.get((name, tuple(sorted(labels.items()))), None)


tmp_dir = []


def main():
    tmp = tempfile.mkdtemp(prefix="oi-obs-")
    tmp_dir.append(tmp)
    sock = os.path.join(tmp, "oi.sock")
    log_path = os.path.join(tmp, "server.log")
    log = open(log_path, "w")
    # A bad address is refused with a clear error, before any pool is set up.
    bad = subprocess.run([EXE, "serve", "--socket", sock, "--pool", "16M", "--metrics-addr",
                          "localhost:notaport"], capture_output=True, text=True, timeout=60)
    if "no HTTP endpoint" in bad.stderr:
        print("SKIP: this build has no metrics endpoint (libmicrohttpd)")
        sys.exit(77)
    check(bad.returncode == 1 and "metrics_addr" in bad.stderr, "bad --metrics-addr: %r" % bad.stderr)

    srv = subprocess.Popen([EXE, "serve", "--socket", sock, "--pool", "64M", "--log-level", "info",
                            "--metrics-addr", "127.0.0.1:0"], stdout=log, stderr=log)
    port = None
    try:
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            text = open(log_path).read()
            m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", text)
            if m and "listening on" in text:
                port = int(m.group(1))
            elif srv.poll() is not None:
                break
            else:
                time.sleep(0.05)
        if port is None:
            print(open(log_path).read(), file=sys.stderr)
            check(False, "the server did not report its metrics port")
            return
        check(port != 0, "port 0 was replaced by the bound port")

        status, _, body = get(port, "/healthz")
        check(status == 200 and body.startswith("ok"), "healthz: %d %r" % (status, body))
        status, _, _ = get(port, "/nothing")
        check(status == 404, "unknown path: %d" % status)
        status, _, _ = get(port, "/metrics", method="POST")
        check(status == 405, "POST: %d" % status)

        m0 = scrape(port)
        check(val(m0, "openinfer_pool_capacity_bytes") == 64 << 20, "capacity")
        info = [(dict(k[1]), v) for k, v in m0.items() if k[0] == "openinfer_info"]
        check(len(info) == 1 and info[0][1] == 1 and info[0][0]["version"].startswith("0.")
              and len(info[0][0]["epoch"]) == 16, "openinfer_info %r" % info)
        for state in ("free", "in_flight", "sealed", "leased", "loading"):
            check(val(m0, "openinfer_blocks", state=state) == 0, "blocks{%s} at start" % state)
        check(val(m0, "openinfer_save_duration_seconds_count") == 0, "no saves yet")

        n, miss = 8, 4
        r = subprocess.run([CLIENT, sock, "obs-ns \"quoted\"", str(n), str(miss)],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, "client: %d %s %s" % (r.returncode, r.stdout, r.stderr))
        cm = re.search(r"instance=(\d+)", r.stdout)

        # The client's session ends asynchronously after it exits.
        for _ in range(200):
            m1 = scrape(port)
            if val(m1, "openinfer_sessions") == 0 and val(m1, "openinfer_instances") == 0:
                break
            time.sleep(0.05)
        d = lambda k, **l: (val(m1, k, **l) or 0) - (val(m0, k, **l) or 0)
        check(d("openinfer_save_blocks_submitted_total") == n, "saves submitted")
        check(d("openinfer_save_blocks_completed_total") == n, "saves completed")
        check(d("openinfer_saved_bytes_total") == n * 4096, "bytes saved")
        check(d("openinfer_loads_submitted_total") == 1, "loads submitted")
        check(d("openinfer_loads_completed_total") == 1, "loads completed")
        check(d("openinfer_loads_failed_total") == 0, "loads failed")
        check(d("openinfer_loaded_blocks_total") == n, "blocks loaded")
        check(d("openinfer_loaded_bytes_total") == n * 4096, "bytes loaded")
        check(d("openinfer_query_hit_blocks_total") == n + 1, "query hits")
        check(d("openinfer_query_miss_blocks_total") == miss, "query misses")
        check(d("openinfer_leases_released_total") == 2, "leases released (consumed + released)")
        check(val(m1, "openinfer_leases_active") == 0, "no lease left")
        check(d("openinfer_save_duration_seconds_count") == 1, "one save operation timed")
        check(d("openinfer_load_duration_seconds_count") == 1, "one load operation timed")
        check(val(m1, "openinfer_save_duration_seconds_sum") > 0, "save time sum")
        check(val(m1, "openinfer_blocks", state="sealed") == n, "sealed blocks")
        check(val(m1, "openinfer_blocks_pinned_for_load") == 0, "nothing pinned after the client")
        check(val(m1, "openinfer_namespace_resident_blocks", namespace='obs-ns \\"quoted\\"') == n,
              "namespace resident blocks (escaped label)")
        check(val(m1, "openinfer_pool_used_bytes") > 0, "a chunk was carved")
        check(val(m1, "openinfer_pool_used_bytes") + val(m1, "openinfer_pool_free_bytes")
              == 64 << 20, "used + free == capacity")
        check(val(m1, "openinfer_instances") == 0 and val(m1, "openinfer_sessions") == 0,
              "the client's session and instance are gone")
        check(d("openinfer_instances_cleaned_up_total") == 0, "the client unregistered")
        # The read-rate estimates: the default seeds (OI_RATE_DEFAULT_*), and
        # no sample (the client's load is 32 KiB, under the 1 MiB a sample needs).
        seeds = {"link": 16000000000, "disk": 2000000000, "remote": 1000000000}
        for path, seed in seeds.items():
            check(val(m1, "openinfer_read_rate_bytes_per_second", path=path) == seed,
                  "read rate %s" % path)
            check(val(m1, "openinfer_read_rate_samples_total", path=path) == 0,
                  "read rate samples %s" % path)

        # openinfer stats, both forms, agree with /metrics.
        js = subprocess.run([EXE, "stats", "--socket", sock, "--json"], capture_output=True,
                            text=True, timeout=30)
        check(js.returncode == 0, "stats --json: %s" % js.stderr)
        if js.returncode == 0:
            j = json.loads(js.stdout)
            h = j["host"]
            check(h["saves_completed"] == val(m1, "openinfer_save_blocks_completed_total"),
                  "stats json saves")
            check(h["blocks_loaded"] == n and h["loads_submitted"] == 1, "stats json loads")
            check(h["blocks_sealed"] == n and h["capacity_bytes"] == 64 << 20, "stats json pool")
            check(sum(h["save_latency_us"]) == 1 and len(h["save_latency_us"]) == 28,
                  "stats json histogram")
            for path in ("link", "disk", "remote"):
                check(h[path + "_bytes_per_s"] ==
                      val(m1, "openinfer_read_rate_bytes_per_second", path=path)
                      and h[path + "_samples"] ==
                      val(m1, "openinfer_read_rate_samples_total", path=path),
                      "stats json read rate %s: %r" % (path, h.get(path + "_bytes_per_s")))
            check(j["namespaces"] == [{"name": 'obs-ns "quoted"', "block_bytes": 4096,
                                       "blocks_resident": n, "codec": "none",
                                       "stored_bytes": 4096, "logical_bytes": n * 4096,
                                       "physical_bytes": n * 4096}], "stats json namespaces %r"
                  % j["namespaces"])
        hs = subprocess.run([EXE, "stats", "--socket", sock], capture_output=True, text=True,
                            timeout=30)
        check(hs.returncode == 0 and "saves:" in hs.stdout and "load latency:" in hs.stdout
              and 'obs-ns "quoted"' in hs.stdout, "stats summary: %r %r" % (hs.stdout, hs.stderr))
        check("read rates:    link 16.00 GB/s (0 samples), disk 2.00 GB/s (0), remote 1.00 GB/s (0)"
              in hs.stdout, "stats summary read rates: %r" % hs.stdout)
        none = subprocess.run([EXE, "stats", "--socket", os.path.join(tmp, "nothing.sock")],
                              capture_output=True, text=True, timeout=30)
        check(none.returncode == 1 and "no openinfer server" in none.stderr, "stats without server")

        # Logs: one logfmt line per event; events of an instance name it.
        lines = [l for l in open(log_path).read().splitlines() if l.startswith("openinfer: ")]
        fmt = re.compile(r'^openinfer: level=(trace|debug|info|warn|error) component=[a-z]+ '
                         r'(instance=\d+ )?msg="(?:[^"\\]|\\.)*"$')
        bad_lines = [l for l in lines if not fmt.match(l)]
        check(lines and not bad_lines, "log lines not in logfmt: %r" % bad_lines[:3])
        if cm:
            inst = cm.group(1)
            check(any(("instance=%s " % inst) in l and "registered" in l for l in lines),
                  "the registration line names instance=%s" % inst)
        check(not any("component=engine" in l and "save" in l and "level=info" in l
                      for l in lines), "no per-operation INFO lines")
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
            try:
                rc = srv.wait(timeout=30)
            except subprocess.TimeoutExpired:
                srv.kill()
                rc = srv.wait()
            check(rc == 0, "the server's exit status is %d" % rc)
        log.close()
    if port:
        try:
            get(port, "/healthz")
            check(False, "the endpoint is gone after the stop")
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
    if failures:
        print(open(log_path).read(), file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    finally:  # the socket, the log: no /tmp/oi-obs-* left behind
        for d in tmp_dir:
            shutil.rmtree(d, ignore_errors=True)
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)
