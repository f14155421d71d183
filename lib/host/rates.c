/* The host's read-rate estimates (host.h: oi_host_stats.*_bytes_per_s):
 * the link's from the loads, each tier's from its promotions. An estimate
 * starts at its seed and moves by an EWMA per sample. A tier's sample is
 * the bytes it promoted over the time some promotion of it was in flight
 * (a busy period), so that concurrent reads count as the throughput they
 * give, not as the latency of each. */
#include "host_private.h"

#define RATE_WEIGHT 0.25 /* the EWMA's weight of a new sample */
/* A sample of fewer bytes measures the fixed cost of a transfer (a thread's
 * wake-up, a submission), not the rate: it is not taken. */
#define RATE_MIN_BYTES (1ull << 20)

void oi__rates_init(oi_host *h) {
  const uint64_t seed[OI_RATES] = {
      h->opts.link_bytes_per_s ? h->opts.link_bytes_per_s : OI_RATE_DEFAULT_LINK,
      h->opts.disk_bytes_per_s ? h->opts.disk_bytes_per_s : OI_RATE_DEFAULT_DISK,
      h->opts.remote_bytes_per_s ? h->opts.remote_bytes_per_s : OI_RATE_DEFAULT_REMOTE,
  };
  for (int i = 0; i < OI_RATES; i++) {
    host_rate *r = &h->rates[i];
    pthread_mutex_init(&r->lock, NULL);
    r->bytes_per_s = (double)seed[i];
    r->samples = 0;
    r->in_flight = 0;
    r->busy_bytes = 0;
  }
}

void oi__rates_fini(oi_host *h) {
  for (int i = 0; i < OI_RATES; i++)
    pthread_mutex_destroy(&h->rates[i].lock);
}

static void sample_locked(host_rate *r, uint64_t bytes, uint64_t ns) {
  if (bytes < RATE_MIN_BYTES || !ns) return;
  double s = (double)bytes * 1e9 / (double)ns;
  r->bytes_per_s = r->samples ? r->bytes_per_s + RATE_WEIGHT * (s - r->bytes_per_s) : s;
  r->samples++;
}

void oi__rate_sample(oi_host *h, int which, uint64_t bytes, uint64_t ns) {
  host_rate *r = &h->rates[which];
  pthread_mutex_lock(&r->lock);
  sample_locked(r, bytes, ns);
  pthread_mutex_unlock(&r->lock);
}

void oi__rate_busy_begin(oi_host *h, int which, size_t k) {
  if (!k) return;
  host_rate *r = &h->rates[which];
  pthread_mutex_lock(&r->lock);
  if (r->in_flight == 0) {
    r->busy_start_ns = oi__now_ns();
    r->busy_bytes = 0;
  }
  r->in_flight += k;
  pthread_mutex_unlock(&r->lock);
}

void oi__rate_busy_end(oi_host *h, int which, uint64_t bytes, bool ok) {
  host_rate *r = &h->rates[which];
  pthread_mutex_lock(&r->lock);
  if (ok) r->busy_bytes += bytes;
  if (r->in_flight && --r->in_flight == 0)
    sample_locked(r, r->busy_bytes, oi__now_ns() - r->busy_start_ns);
  pthread_mutex_unlock(&r->lock);
}

void oi__rates_read(const oi_host *h, uint64_t bytes_per_s[OI_RATES], uint64_t samples[OI_RATES]) {
  for (int i = 0; i < OI_RATES; i++) {
    host_rate *r = (host_rate *)&h->rates[i];
    pthread_mutex_lock(&r->lock);
    bytes_per_s[i] = (uint64_t)r->bytes_per_s;
    samples[i] = r->samples;
    pthread_mutex_unlock(&r->lock);
  }
}

int oi__rate_of_where(uint32_t where) {
  return where == OI_WHERE_DISK ? OI_RATE_DISK : where == OI_WHERE_REMOTE ? OI_RATE_REMOTE : -1;
}
