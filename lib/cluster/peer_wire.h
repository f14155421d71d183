/* The peer transport's messages (lib/cluster/peer_*.c), described once:
 * the code and the tests that build or read raw peer messages
 * (tests/cluster) share these. Every field is little-endian; see
 * docs/cluster.md, "Peer transport".
 *
 * The handshake runs over a plain TCP connection to the node's listener
 * (not UCX: no byte of an unauthenticated peer reaches UCX), as frames:
 * kind (4; an id below), payload length (4; at most OI_PEER_MAX_FRAME),
 * the payload. In order: HELLO (client), CHALLENGE (server), AUTH
 * (client), WELCOME or REFUSE (server), ADDR (server: its UCX worker
 * address), ADDR (client: the address of the worker it made for this
 * connection), READY (server, empty: its endpoint to the client exists);
 * then the socket is closed and the connection goes on over UCX endpoints
 * both sides created from those addresses. Anything else (a frame out of
 * turn, too large, malformed, or late past the handshake timeout) closes
 * the socket.
 *
 * After the handshake each message is a UCX active message whose id says
 * its kind:
 *  - HELLO (client -> server) and CHALLENGE (server -> client): magic (4),
 *    version (2), id length (2), nonce (OI_PEER_NONCE), node id (no NUL);
 *    OI_PEER_HELLO_FIXED bytes before the id.
 *  - AUTH (client): magic (4), the client's proof, an HMAC-SHA256
 *    (OI_PEER_MAC_LEN) over the label, both nonces and both ids.
 *  - WELCOME (server): magic (4), the server's proof (OI_PEER_MAC_LEN),
 *    region base (8), region length (8), rkey length (4), flags (4;
 *    OI_PEER_WELCOME_RMA), then the rkey; OI_PEER_WELCOME_FIXED bytes
 *    before the rkey.
 *  - REFUSE (server): magic (4): the proof failed.
 *  - REQ: call id (8; OI_PEER_REQ_FIXED), then the request's payload.
 *  - REP: call id (8), status (4; OI_PEER_REP_FIXED), then the reply.
 *  - READ (a read served by the holder's CPU, when there is no one-sided
 *    RMA): OI_PEER_READ_LEN bytes: get id (8), read index (4), pad (4),
 *    offset (8), length (8).
 *  - DATA (its bytes): a header of OI_PEER_DATA_HDR bytes (get id (8),
 *    read index (4), status (4)); the data is the payload. */
#ifndef OI_CLUSTER_PEER_WIRE_H
#define OI_CLUSTER_PEER_WIRE_H

#include "cluster/peer.h"

/* Active message ids. */
enum {
  OI_PEER_AM_HELLO = 1,
  OI_PEER_AM_CHALLENGE,
  OI_PEER_AM_AUTH,
  OI_PEER_AM_WELCOME,
  OI_PEER_AM_REFUSE,
  OI_PEER_AM_REQ,
  OI_PEER_AM_REP,
  OI_PEER_AM_READ, /* a read served by the holder's CPU (no native RMA: see get_cb) */
  OI_PEER_AM_DATA, /* its bytes: the header says which read; the data is the payload */
  OI_PEER_AM_LAST,
  OI_PEER_FR_ADDR = 16, /* handshake frame: a UCX worker address */
  OI_PEER_FR_READY = 17 /* handshake frame: the server's endpoint exists */
};

#define OI_PEER_FRAME_HDR 8      /* kind, payload length */
#define OI_PEER_MAX_FRAME 16384u /* bytes of a frame's payload, at most */

#define OI_PEER_MAGIC 0x5250494fu /* "OIPR" */
#define OI_PEER_VERSION 1u
#define OI_PEER_HELLO_FIXED (4 + 2 + 2 + OI_PEER_NONCE)
#define OI_PEER_WELCOME_FIXED (4 + OI_PEER_MAC_LEN + 8 + 8 + 4 + 4)
#define OI_PEER_WELCOME_RMA 1u /* flag: the holder serves one-sided reads (rkey follows) */
#define OI_PEER_READ_LEN 32    /* get id, read index, pad, offset, length */
#define OI_PEER_DATA_HDR 16    /* get id, read index, status */
#define OI_PEER_REQ_FIXED 8
#define OI_PEER_REP_FIXED 12

#endif /* OI_CLUSTER_PEER_WIRE_H */
