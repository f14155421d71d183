/* The sidecar server's frame decoder and request validation: the input is a
 * byte stream as a client would write it to the socket. Each frame goes
 * through the session's own path, without a socket: the length prefix check
 * (oi__wire_frame_length, as oi__wire_recv), the Envelope decoder
 * (oi__wire_decode) and every check a request gets before it touches an
 * instance (oi__request_check, whose pieces the session's handlers call).
 * Where the session would drop the connection, the stream stops.
 *
 * Properties: nothing crashes or leaks; decoded arrays respect the wire
 * bounds; an error always comes with a message; a request that passes has
 * arrays that re-encode and decode to the same values. */
#include "fuzz_util.h"
#include "server/server_internal.h"

static void check_round_trip(const oiwire_Envelope *env, const oi_wire_arrays *a) {
  oi_wire_out out = {0};
  switch (env->which_body) {
  case oiwire_Envelope_save_tag:
    out = (oi_wire_out){
        .ids = a->ids, .n_ids = a->n_ids, .hashes = a->hashes, .n_hashes = a->n_hashes};
    break;
  case oiwire_Envelope_query_tag:
    out = (oi_wire_out){.hashes = a->hashes, .n_hashes = a->n_hashes};
    break;
  case oiwire_Envelope_load_tag: out = (oi_wire_out){.ids = a->ids, .n_ids = a->n_ids}; break;
  default: return;
  }
  uint8_t *frame = NULL;
  size_t len = 0;
  if (oi__wire_encode(env, &out, &frame, &len) != OI_OK) return; /* e.g. over the frame limit */
  uint32_t n = 0;
  FZ_ASSERT(len >= 4 && oi__wire_frame_length(frame, OI_WIRE_MAX_FRAME, &n) == OI_OK &&
                n == len - 4,
            "an encoded frame's prefix says %u for %zu bytes", n, len);
  oiwire_Envelope env2;
  oi_wire_arrays b;
  memset(&b, 0, sizeof b);
  oi_status st = oi__wire_decode(frame + 4, n, &env2, &b);
  FZ_ASSERT(st == OI_OK, "a re-encoded request does not decode: %s", oi_last_error());
  FZ_ASSERT(env2.which_body == env->which_body && env2.request_id == env->request_id, "body %u/%u",
            env2.which_body, env->which_body);
  FZ_ASSERT(b.bad == OI_OK, "a re-encoded request has a bad element: %s", b.bad_msg);
  FZ_ASSERT(b.n_ids == a->n_ids && b.n_hashes == a->n_hashes, "counts %zu/%zu ids, %zu/%zu hashes",
            b.n_ids, a->n_ids, b.n_hashes, a->n_hashes);
  FZ_ASSERT(!a->n_ids || !memcmp(b.ids, a->ids, a->n_ids * sizeof *a->ids), "ids differ");
  FZ_ASSERT(!a->n_hashes || !memcmp(b.hashes, a->hashes, a->n_hashes * sizeof *a->hashes),
            "hashes differ");
  oi__wire_arrays_free(&b);
  oi__free(frame);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  oi_wire_arrays a;
  memset(&a, 0, sizeof a);
  oiwire_Envelope env;
  size_t off = 0;
  while (size - off >= 4) {
    uint32_t n = 0;
    if (oi__wire_frame_length(data + off, OI_WIRE_MAX_FRAME, &n) != OI_OK) break; /* dropped */
    off += 4;
    if (n > size - off) break; /* the stream ends inside a frame: dropped */
    /* An exact-size copy, so a read past the payload is caught. */
    uint8_t *payload = malloc(n ? n : 1);
    if (!payload) break;
    memcpy(payload, data + off, n);
    off += n;
    oi_status st = oi__wire_decode(payload, n, &env, &a);
    if (st != OI_OK) { /* garbage: the session says why and ends */
      FZ_ASSERT(st == OI_ERR_PROTOCOL && oi_last_error()[0], "decode failed with %s",
                oi_status_str(st));
      free(payload);
      break;
    }
    FZ_ASSERT(a.n_ids <= OI_WIRE_MAX_BLOCKS && a.n_hashes <= OI_WIRE_MAX_BLOCKS &&
                  a.n_present <= OI_WIRE_MAX_BLOCKS && a.n_arenas <= OI_WIRE_MAX_ARENAS &&
                  a.n_namespaces <= OI_WIRE_MAX_NAMESPACES,
              "arrays past the wire bounds");
    FZ_ASSERT(a.bad == OI_OK || (a.bad == OI_ERR_INVALID_ARGUMENT && a.bad_msg[0]), "bad %d",
              a.bad);
    FZ_ASSERT(memchr(a.bad_msg, 0, sizeof a.bad_msg) != NULL, "bad_msg is not terminated");
    char msg[512];
    st = oi__request_check(&env, &a, msg, sizeof msg);
    FZ_ASSERT(memchr(msg, 0, sizeof msg) != NULL, "message not terminated");
    FZ_ASSERT(st == OI_OK || msg[0], "%s without a message", oi_status_str(st));
    if (st == OI_OK) check_round_trip(&env, &a);
    free(payload);
  }
  oi__wire_arrays_free(&a);
  oi_clear_error();
  return 0;
}
