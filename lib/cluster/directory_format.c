/* The block directory's formats: node ids, addresses, the keys and
 * values it writes in Redis, the URL, Redis Cluster's slots. See
 * directory_internal.h. */
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cluster/directory_internal.h"

/* ---- formats ---- */

static bool node_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

bool oi__dir_node_id_valid(const char *s, size_t len) {
  if (len == 0 || len > OI_DIR_NODE_ID_MAX) return false;
  for (size_t i = 0; i < len; i++)
    if (!node_id_char(s[i])) return false;
  return true;
}

bool oi__dir_addr_valid(const char *s, size_t len) {
  if (len == 0 || len > OI_DIR_ADDR_MAX) return false;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) return false;
  return true;
}

/* Decimal digits of a uint64_t (no sign, no leading '+', no overflow). */
bool oi__dir_parse_u64(const char *s, size_t len, uint64_t *out) {
  if (len == 0 || len > 20) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    uint64_t digit = (uint64_t)(s[i] - '0');
    if (v > (UINT64_MAX - digit) / 10) return false;
    v = v * 10 + digit;
  }
  *out = v;
  return true;
}

bool oi__dir_prefix(const char *name, char out[OI_DIR_PREFIX_MAX + 1]) {
  if (!name || !name[0]) {
    memcpy(out, "oi:", 4);
    return true;
  }
  size_t len = strnlen(name, OI_DIR_NAME_MAX + 1);
  if (len > OI_DIR_NAME_MAX || !oi__dir_node_id_valid(name, len)) return false;
  snprintf(out, OI_DIR_PREFIX_MAX + 1, "oi:%s:", name);
  return true;
}

size_t oi__dir_key_format(const char *prefix, const oi_tier_key *key,
                          char out[OI_DIR_KEY_MAX + 1]) {
  static const char hex[] = "0123456789abcdef";
  if (!prefix) prefix = "oi:";
  size_t pl = strnlen(prefix, OI_DIR_PREFIX_MAX);
  char *p = out;
  memcpy(p, prefix, pl);
  p += pl;
  memcpy(p, "b:", 2);
  p += 2;
  for (int i = 15; i >= 0; i--)
    *p++ = hex[(key->ns_fp >> (4 * i)) & 15];
  *p++ = ':';
  for (int i = 0; i < 16; i++) {
    *p++ = hex[key->hash[i] >> 4];
    *p++ = hex[key->hash[i] & 15];
  }
  *p++ = ':';
  for (int i = 15; i >= 0; i--)
    *p++ = hex[(key->layout_fp >> (4 * i)) & 15];
  *p = '\0';
  return (size_t)(p - out);
}

/* 32 lowercase hex digits into mac. */
static bool parse_mac(const char *s, size_t len, uint8_t mac[OI_DIR_MAC_LEN]) {
  if (len != 2 * OI_DIR_MAC_LEN) return false;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return false;
    if (i % 2 == 0)
      mac[i / 2] = (uint8_t)(v << 4);
    else
      mac[i / 2] |= (uint8_t)v;
  }
  return true;
}

static size_t put_mac(char *out, const uint8_t mac[OI_DIR_MAC_LEN]) {
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < OI_DIR_MAC_LEN; i++) {
    out[2 * i] = hex[mac[i] >> 4];
    out[2 * i + 1] = hex[mac[i] & 15];
  }
  out[2 * OI_DIR_MAC_LEN] = '\0';
  return 2 * OI_DIR_MAC_LEN;
}

/* Splits "<head> <expiry_ms> <mac>" off its end: *head_len is the head's. */
static bool split_tail(const char *s, size_t len, size_t *head_len, uint64_t *expiry_ms,
                       uint8_t mac[OI_DIR_MAC_LEN]) {
  if (len < 2 * OI_DIR_MAC_LEN + 4) return false;
  size_t m = len - 2 * OI_DIR_MAC_LEN;
  if (s[m - 1] != ' ' || !parse_mac(s + m, 2 * OI_DIR_MAC_LEN, mac)) return false;
  size_t e = m - 1; /* the expiry ends here */
  size_t b = e;
  while (b > 0 && s[b - 1] != ' ')
    b--;
  if (b == 0 || !oi__dir_parse_u64(s + b, e - b, expiry_ms)) return false;
  *head_len = b - 1;
  return true;
}

bool oi__dir_holder_parse(const char *s, size_t len, oi_dir_holder *out) {
  if (!s) return false;
  size_t hl;
  uint64_t expiry;
  uint8_t mac[OI_DIR_MAC_LEN];
  if (!split_tail(s, len, &hl, &expiry, mac)) return false;
  const char *sp = memchr(s, ' ', hl);
  if (!sp) return false;
  size_t id_len = (size_t)(sp - s);
  if (!oi__dir_node_id_valid(s, id_len)) return false;
  uint64_t epoch;
  if (!oi__dir_parse_u64(sp + 1, hl - id_len - 1, &epoch)) return false;
  memcpy(out->node_id, s, id_len);
  out->node_id[id_len] = '\0';
  out->epoch = epoch;
  out->expiry_ms = expiry;
  memcpy(out->mac, mac, sizeof out->mac);
  return true;
}

bool oi__dir_liveness_parse(const char *s, size_t len, uint64_t *epoch, size_t *addr_off,
                            size_t *addr_len, uint64_t *expiry_ms, uint8_t mac[OI_DIR_MAC_LEN]) {
  if (!s) return false;
  size_t hl;
  uint64_t x;
  uint8_t m[OI_DIR_MAC_LEN];
  if (!split_tail(s, len, &hl, &x, m)) return false;
  const char *sp = memchr(s, ' ', hl);
  uint64_t e;
  size_t alen = sp ? hl - (size_t)(sp - s) - 1 : 0;
  if (!sp || !oi__dir_parse_u64(s, (size_t)(sp - s), &e) || !oi__dir_addr_valid(sp + 1, alen))
    return false;
  *epoch = e;
  *addr_off = (size_t)(sp - s) + 1;
  *addr_len = alen;
  if (expiry_ms) *expiry_ms = x;
  if (mac) memcpy(mac, m, OI_DIR_MAC_LEN);
  return true;
}

/* ---- MACs ---- */

uint64_t oi__dir_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void oi__dir_mac(const oi_dir *d, const char *tag, const char *key, size_t klen, const char *fields,
                 size_t flen, uint8_t out[OI_DIR_MAC_LEN]) {
  oi_hmac_sha256 h = d->mac0;
  uint8_t full[OI_SHA256_LEN];
  oi__hmac_sha256_update(&h, tag, strlen(tag) + 1); /* the NUL ends the tag */
  uint8_t kl[2] = {(uint8_t)klen, (uint8_t)(klen >> 8)};
  oi__hmac_sha256_update(&h, kl, 2);
  oi__hmac_sha256_update(&h, key, klen);
  oi__hmac_sha256_update(&h, fields, flen);
  oi__hmac_sha256_final(&h, full);
  memcpy(out, full, OI_DIR_MAC_LEN);
  memset(&h, 0, sizeof h);
}

size_t oi__dir_entry_value(const oi_dir *d, const char *key, size_t klen, const char *node_id,
                           uint64_t epoch, uint64_t expiry_ms, char *out) {
  int n = snprintf(out, OI_DIR_VALUE_MAX + 1, "%s %" PRIu64 " %" PRIu64, node_id, epoch, expiry_ms);
  uint8_t mac[OI_DIR_MAC_LEN];
  oi__dir_mac(d, OI_DIR_TAG_BLOCK, key, klen, out, (size_t)n, mac);
  out[n] = ' ';
  return (size_t)n + 1 + put_mac(out + n + 1, mac);
}

size_t oi__dir_node_value(const oi_dir *d, const char *addr, uint64_t expiry_ms, char *out) {
  int n =
      snprintf(out, OI_DIR_VALUE_MAX + 1, "%" PRIu64 " %s %" PRIu64, d->o.epoch, addr, expiry_ms);
  uint8_t mac[OI_DIR_MAC_LEN];
  oi__dir_mac(d, OI_DIR_TAG_NODE, d->node_key, strlen(d->node_key), out, (size_t)n, mac);
  out[n] = ' ';
  return (size_t)n + 1 + put_mac(out + n + 1, mac);
}

void oi__dir_reject(oi_dir *d, const char *key, const char *why) {
  ADD(rejected_entries, 1);
  uint64_t now = oi__now_ns(), last = atomic_load(&d->reject_log_ns);
  if ((last && now - last < 60000000000ull) ||
      !atomic_compare_exchange_strong(&d->reject_log_ns, &last, now))
    return;
  OI_LOG(OI_LOG_WARN, "cluster",
         "directory %s: %s %s; not believed (%" PRIu64
         " so far; a node with another secret, or a writer that is no node)",
         d->url, key, why, atomic_load(&d->rejected_entries));
}

/* The slot of key in d's verified entries (made at the first call; NULL
 * without memory: every entry is then checked in full). */
static verified *seen_slot(oi_dir *d, const char *key, size_t klen) {
  if (!d->seen && !(d->seen = oi__calloc(VERIFIED_SLOTS, sizeof *d->seen))) return NULL;
  return &d->seen[XXH3_64bits(key, klen) & (VERIFIED_SLOTS - 1)];
}

bool oi__dir_entry_check(oi_dir *d, const char *key, size_t klen, const char *s, size_t len,
                         oi_dir_holder *out) {
  if (!oi__dir_holder_parse(s, len, out)) {
    ADD(parse_failures, 1);
    oi__dir_reject(d, key, "does not parse as '<node> <epoch> <expiry> <mac>'");
    return false;
  }
  /* The MAC over the fields as they were written (a good node wrote them
   * once, canonically: what parses from bytes it MACed is what it meant),
   * unless these very bytes passed it before; then the expiry. */
  verified *v = seen_slot(d, key, klen);
  bool known = v && v->klen == klen && v->vlen == len && memcmp(v->key, key, klen) == 0 &&
               memcmp(v->val, s, len) == 0;
  if (!known) {
    uint8_t mac[OI_DIR_MAC_LEN];
    oi__dir_mac(d, OI_DIR_TAG_BLOCK, key, klen, s, len - 2 * OI_DIR_MAC_LEN - 1, mac);
    if (!oi__ct_equal(mac, out->mac, OI_DIR_MAC_LEN)) {
      oi__dir_reject(d, key, "fails its MAC");
      return false;
    }
    if (v && klen <= sizeof v->key && len <= sizeof v->val) {
      memcpy(v->key, key, klen);
      memcpy(v->val, s, len);
      v->klen = (uint16_t)klen;
      v->vlen = (uint16_t)len;
    }
  }
  if (out->expiry_ms + OI_DIR_CLOCK_SKEW_MS < oi__dir_wall_ms()) {
    oi__dir_reject(d, key, "expired (a replay, or clocks more than 30 s apart)");
    return false;
  }
  return true;
}

/* ---- Redis AUTH ---- */

static oi_status auth_file(const char *path, char *user, char *password) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return oi__fail(errno == ENOENT ? OI_ERR_NOT_FOUND : OI_ERR_PERMISSION,
                    "directory: cannot open the Redis auth file %s: %s", path, strerror(errno));
  struct stat st;
  char buf[OI_DIR_USER_MAX + OI_DIR_PASSWORD_MAX + 256];
  oi_status s = OI_OK;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    s = oi__fail(OI_ERR_PERMISSION, "directory: the Redis auth file %s is not a regular file",
                 path);
  else if (st.st_uid != geteuid() || (st.st_mode & 077))
    s = oi__fail(OI_ERR_PERMISSION,
                 "directory: the Redis auth file %s must belong to this user and be readable "
                 "by no one else (chmod 600 %s)",
                 path, path);
  ssize_t n = s == OI_OK ? read(fd, buf, sizeof buf - 1) : 0;
  close(fd);
  if (s != OI_OK) return s;
  if (n < 0)
    return oi__fail(OI_ERR_IO, "directory: reading the Redis auth file %s: %s", path,
                    strerror(errno));
  if ((size_t)n >= sizeof buf - 1)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory: the Redis auth file %s is too long", path);
  buf[n] = '\0';
  int line_no = 0;
  for (char *line = buf, *next; line && *line; line = next) {
    line_no++;
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    size_t len = strlen(line);
    if (len && line[len - 1] == '\r') line[--len] = '\0';
    if (len == 0 || line[0] == '#') continue;
    char *eq = strchr(line, '=');
    bool is_user = eq && (size_t)(eq - line) == 4 && !strncmp(line, "user", 4);
    bool is_pass = eq && (size_t)(eq - line) == 8 && !strncmp(line, "password", 8);
    size_t vlen = eq ? strlen(eq + 1) : 0;
    if (!is_user && !is_pass) {
      s = oi__fail(OI_ERR_INVALID_ARGUMENT,
                   "directory: the Redis auth file %s, line %d: expected user=NAME or "
                   "password=SECRET",
                   path, line_no);
      break;
    }
    if (vlen == 0 || vlen > (is_user ? OI_DIR_USER_MAX : OI_DIR_PASSWORD_MAX)) {
      s = oi__fail(OI_ERR_INVALID_ARGUMENT,
                   "directory: the Redis auth file %s, line %d: the %s is empty or longer than "
                   "%u bytes",
                   path, line_no, is_user ? "user" : "password",
                   is_user ? OI_DIR_USER_MAX : OI_DIR_PASSWORD_MAX);
      break;
    }
    memcpy(is_user ? user : password, eq + 1, vlen + 1);
  }
  memset(buf, 0, sizeof buf);
  if (s == OI_OK && !password[0])
    s = oi__fail(OI_ERR_INVALID_ARGUMENT,
                 "directory: the Redis auth file %s has no password=SECRET line", path);
  if (s != OI_OK) {
    memset(user, 0, OI_DIR_USER_MAX + 1);
    memset(password, 0, OI_DIR_PASSWORD_MAX + 1);
  }
  return s;
}

oi_status oi__dir_auth_load(const char *file, char user[OI_DIR_USER_MAX + 1],
                            char password[OI_DIR_PASSWORD_MAX + 1]) {
  if (!user || !password)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "oi__dir_auth_load: user and password are NULL");
  memset(user, 0, OI_DIR_USER_MAX + 1);
  memset(password, 0, OI_DIR_PASSWORD_MAX + 1);
  if (file && file[0]) return auth_file(file, user, password);
  const char *p = getenv("OI_REDIS_PASSWORD"), *u = getenv("OI_REDIS_USER");
  if (!p || !p[0]) {
    if (u && u[0])
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory: OI_REDIS_USER is set but OI_REDIS_PASSWORD is not");
    return OI_OK;
  }
  if (strlen(p) > OI_DIR_PASSWORD_MAX || (u && strlen(u) > OI_DIR_USER_MAX))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory: OI_REDIS_USER or OI_REDIS_PASSWORD is longer than %u or %u bytes",
                    OI_DIR_USER_MAX, OI_DIR_PASSWORD_MAX);
  strcpy(password, p);
  if (u) strcpy(user, u);
  return OI_OK;
}

/* "HOST[:PORT]" at p, ending at '/', ',' or the end (*endp: there). */
static oi_status parse_hostport(const char *url, const char *p, const char **endp, char *hostbuf,
                                size_t cap, int *port_out, const char *help) {
  const char *host = p, *host_end;
  if (*p == '[') {
    host = p + 1;
    host_end = strchr(host, ']');
    if (!host_end)
      return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': '[' without ']' (%s)", url,
                      help);
    p = host_end + 1;
  } else {
    host_end = p + strcspn(p, ":/,");
    p = host_end;
  }
  size_t host_len = (size_t)(host_end - host);
  if (host_len == 0 || host_len >= cap)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': %s host (%s)", url,
                    host_len ? "an overlong" : "no", help);
  for (size_t i = 0; i < host_len; i++)
    if (!node_id_char(host[i]) && host[i] != ':')
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the host has a character '%c' no host name or "
                      "address has (%s)",
                      url, host[i], help);
  memcpy(hostbuf, host, host_len);
  hostbuf[host_len] = '\0';
  *port_out = 6379;
  if (*p == ':') {
    p++;
    size_t len = strcspn(p, "/,");
    uint64_t port;
    if (!oi__dir_parse_u64(p, len, &port) || port == 0 || port > 65535)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the port is not a number in 1..65535 (%s)", url, help);
    *port_out = (int)port;
    p += len;
  }
  *endp = p;
  return OI_OK;
}

/* A password in a url would show in `ps`, shell histories and logs. */
static oi_status no_credentials(const char *url) {
  const char *at = strrchr(url, '@');
  return oi__fail(OI_ERR_INVALID_ARGUMENT,
                  "directory url '...%s': credentials in the url are refused (they would show "
                  "in ps and logs): put password=SECRET (and user=NAME) in a file of mode 0600 "
                  "given with --redis-auth-file (redis_auth_file), or set OI_REDIS_PASSWORD (and "
                  "OI_REDIS_USER) in the environment",
                  at ? at : url);
}

/* url starts "redis" ("rediss" with tls) and then tail: *rest after it. */
static bool scheme_is(const char *url, bool tls, const char *tail, const char **rest) {
  size_t k = tls ? 6 : 5, t = strlen(tail);
  if (strncmp(url, tls ? "rediss" : "redis", k) != 0 || strncmp(url + k, tail, t) != 0)
    return false;
  *rest = url + k + t;
  return true;
}

/* "redis://HOST[:PORT][/DB]", "unix:/PATH[?db=DB]" or
 * "redis+cluster://HOST[:PORT][,HOST[:PORT]...]" into d; "rediss" for
 * "redis": the same over TLS. */
oi_status oi__dir_parse_url(oi_dir *d, const char *url) {
  static const char help[] = "expected redis://HOST[:PORT][/DB], unix:/PATH[?db=DB] or "
                             "redis+cluster://HOST[:PORT][,HOST[:PORT]...] (rediss:// and "
                             "rediss+cluster:// over TLS)";
  const char *p;
  d->tls = strncmp(url, "rediss", 6) == 0;
  if (strncmp(url, "unix:", 5) == 0) {
    p = url + 5;
    const char *q = strchr(p, '?');
    size_t len = q ? (size_t)(q - p) : strlen(p);
    if (len < 2 || p[0] != '/')
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the socket path must be absolute (%s)", url, help);
    if (len >= sizeof(d->unix_path))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': the socket path is longer than %zu bytes", url,
                      sizeof(d->unix_path) - 1);
    memcpy(d->unix_path, p, len);
    d->unix_path[len] = '\0';
    if (q) {
      uint64_t db;
      if (strncmp(q, "?db=", 4) != 0 || !oi__dir_parse_u64(q + 4, strlen(q + 4), &db) ||
          db > 1000000)
        return oi__fail(OI_ERR_INVALID_ARGUMENT,
                        "directory url '%s': '%s' is not ?db=N with N a database number (%s)", url,
                        q, help);
      d->db = (uint32_t)db;
    }
    return OI_OK;
  }
  if (scheme_is(url, d->tls, "+cluster://", &p)) {
    d->cluster = true;
    if (strchr(url, '@')) return no_credentials(url);
    for (;;) {
      if (d->n_seeds == SEEDS_MAX)
        return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': more than %u addresses", url,
                        SEEDS_MAX);
      oi_status st = parse_hostport(url, p, &p, d->seeds[d->n_seeds].host, sizeof d->seeds[0].host,
                                    &d->seeds[d->n_seeds].port, help);
      if (st != OI_OK) return st;
      d->n_seeds++;
      if (*p != ',') break;
      p++;
    }
    if (*p == '/' && (p[1] == '\0' || strcmp(p + 1, "0") == 0)) p += strlen(p);
    if (*p)
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': unexpected '%s' (a Redis Cluster has database 0 "
                      "only; %s)",
                      url, p, help);
    return OI_OK;
  }
  if (!scheme_is(url, d->tls, "://", &p))
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': unknown scheme (%s)", url, help);
  if (strchr(url, '@')) return no_credentials(url);
  oi_status st = parse_hostport(url, p, &p, d->host, sizeof d->host, &d->port, help);
  if (st != OI_OK) return st;
  if (*p == '/') {
    p++;
    uint64_t db = 0;
    if (*p && (!oi__dir_parse_u64(p, strlen(p), &db) || db > 1000000))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': '%s' is not a database number (%s)", url, p, help);
    d->db = (uint32_t)db;
  } else if (*p) {
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': unexpected '%s' (%s)", url, p,
                    help);
  }
  return OI_OK;
}

/* ---- Redis Cluster slots ---- */

uint16_t oi__dir_crc16(const char *s, size_t len) {
  uint16_t crc = 0; /* CRC-16/XMODEM: polynomial 0x1021, initial 0, no reflection */
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)((uint16_t)(unsigned char)s[i] << 8);
    for (int b = 0; b < 8; b++)
      crc = (uint16_t)((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

uint16_t oi__dir_key_slot(const char *key, size_t len) {
  const char *open = memchr(key, '{', len);
  if (open) { /* a hash tag: the bytes between the first '{' and the next '}', when not empty */
    size_t off = (size_t)(open - key) + 1;
    const char *close = memchr(key + off, '}', len - off);
    if (close && close > key + off)
      return oi__dir_crc16(key + off, (size_t)(close - key - off)) & (OI_DIR_SLOTS - 1);
  }
  return oi__dir_crc16(key, len) & (OI_DIR_SLOTS - 1);
}
