/* The block directory's formats: node ids, addresses, the keys and
 * values it writes in Redis, the URL, Redis Cluster's slots. See
 * directory_internal.h. */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

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

void oi__dir_key_format(const oi_tier_key *key, char out[OI_DIR_KEY_CHARS + 1]) {
  static const char hex[] = "0123456789abcdef";
  char *p = out;
  memcpy(p, "oi:b:", 5);
  p += 5;
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
}

bool oi__dir_holder_parse(const char *s, size_t len, oi_dir_holder *out) {
  if (!s) return false;
  const char *sp = memchr(s, ' ', len);
  if (!sp) return false;
  size_t id_len = (size_t)(sp - s);
  if (!oi__dir_node_id_valid(s, id_len)) return false;
  uint64_t epoch;
  if (!oi__dir_parse_u64(sp + 1, len - id_len - 1, &epoch)) return false;
  memcpy(out->node_id, s, id_len);
  out->node_id[id_len] = '\0';
  out->epoch = epoch;
  return true;
}

bool oi__dir_liveness_parse(const char *s, size_t len, uint64_t *epoch, size_t *addr_off,
                            size_t *addr_len) {
  if (!s) return false;
  const char *sp = memchr(s, ' ', len);
  uint64_t e;
  size_t alen = sp ? len - (size_t)(sp - s) - 1 : 0;
  if (!sp || !oi__dir_parse_u64(s, (size_t)(sp - s), &e) || !oi__dir_addr_valid(sp + 1, alen))
    return false;
  *epoch = e;
  *addr_off = (size_t)(sp - s) + 1;
  *addr_len = alen;
  return true;
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

/* "redis://HOST[:PORT][/DB]", "unix:/PATH[?db=DB]" or
 * "redis+cluster://HOST[:PORT][,HOST[:PORT]...]" into d. */
oi_status oi__dir_parse_url(oi_dir *d, const char *url) {
  static const char help[] = "expected redis://HOST[:PORT][/DB], unix:/PATH[?db=DB] or "
                             "redis+cluster://HOST[:PORT][,HOST[:PORT]...]";
  const char *p;
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
  if (strncmp(url, "redis+cluster://", 16) == 0) {
    d->cluster = true;
    p = url + 16;
    if (strchr(p, '@'))
      return oi__fail(OI_ERR_INVALID_ARGUMENT,
                      "directory url '%s': credentials in the url are not supported; protect "
                      "Redis by network (bind, firewall)",
                      url);
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
  if (strncmp(url, "redis://", 8) != 0)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "directory url '%s': unknown scheme (%s)", url, help);
  p = url + 8;
  if (strchr(p, '@'))
    return oi__fail(OI_ERR_INVALID_ARGUMENT,
                    "directory url '%s': credentials in the url are not supported; protect "
                    "Redis by network (bind, firewall)",
                    url);
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
